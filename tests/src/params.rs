//! A module's float parameters with their paths (`model.layers.0.mlp.up_proj.weight`), each
//! looked at by a [`ParamProbe`]: one visitor for every backend-specific question a test asks
//! about where the parameters' bytes are.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;

/// Looks at one float parameter (its value, its id), whatever its rank.
pub trait ParamProbe {
    type Out;
    fn probe<const D: usize>(&mut self, param: &Param<Tensor<D>>) -> Self::Out;
}

/// `probe`'s finding on every float parameter of `module`, with the parameter's path.
pub fn probe_float_params<M: Module, P: ParamProbe>(module: &M, probe: P) -> Vec<(String, P::Out)> {
    struct V<P: ParamProbe> {
        probe: P,
        path: Vec<String>,
        out: Vec<(String, P::Out)>,
    }
    impl<P: ParamProbe> ModuleVisitor for V<P> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let found = self.probe.probe(param);
            self.out.push((self.path.join("."), found));
        }
    }
    let mut v = V {
        probe,
        path: Vec::new(),
        out: Vec::new(),
    };
    module.visit(&mut v);
    v.out
}
