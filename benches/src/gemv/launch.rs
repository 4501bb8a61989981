//! `--tunings`: the launch shapes a run measures on a CubeCL device, in the text form the
//! results print, so a shape printed in a result can be passed back.

use anyhow::{Context, Result, bail};
use burn_mapped::q8::{CubeLaunch, CubeTuning, DotTuning, Q8Error, Q8Weight, Tuning};

/// Loads in flight per thread of the read kernel where a spec does not say.
const READ_UNROLL: usize = 4;

/// One `--tunings` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchSpec {
    /// `default`: the per-`T` defaults.
    Default,
    /// `lanes.groups.rows.unroll.read_unroll[.vector]`: the FMA kernel at every `T` (`vector`
    /// 4 if left out), and the read kernel's loads in flight per thread.
    Fma {
        tuning: CubeTuning,
        read_unroll: usize,
    },
    /// `dot.lanes.groups.rows.unroll`: the dp4a kernel at every `T`.
    Dot(DotTuning),
}

impl LaunchSpec {
    /// Parses one entry; whether the kernels run the shape is checked by
    /// [`Q8Weight::with_tuning`] (see [`Self::apply`]).
    pub fn parse(spec: &str) -> Result<Self> {
        if spec == "default" {
            return Ok(LaunchSpec::Default);
        }
        if let Some(rest) = spec.strip_prefix("dot.") {
            let v = counts(rest, &[4]).with_context(|| {
                format!("--tunings: `{spec}` is not dot.lanes.groups.rows.unroll")
            })?;
            return Ok(LaunchSpec::Dot(DotTuning {
                lanes: v[0],
                groups: v[1],
                rows: v[2],
                unroll: v[3],
            }));
        }
        let v = counts(spec, &[5, 6]).with_context(|| {
            format!("--tunings: `{spec}` is not lanes.groups.rows.unroll.read_unroll[.vector]")
        })?;
        if !(1..=16).contains(&v[4]) {
            bail!("--tunings: `{spec}`: read_unroll must be 1 to 16");
        }
        Ok(LaunchSpec::Fma {
            tuning: CubeTuning {
                lanes: v[0],
                groups: v[1],
                rows: v[2],
                unroll: v[3],
                vector: v.get(5).copied().unwrap_or(4),
            },
            read_unroll: v[4],
        })
    }

    /// `w` launched as this spec says, its host slabs `threads`.
    ///
    /// # Errors
    ///
    /// [`Q8Error::Tuning`] for a shape the kernels cannot run.
    pub fn apply(&self, w: &Q8Weight, threads: usize) -> Result<Q8Weight, Q8Error> {
        w.clone().with_tuning(self.tuning(threads))
    }

    /// The products' tuning, with `threads` host slabs.
    pub fn tuning(&self, threads: usize) -> Tuning {
        let cube = match *self {
            LaunchSpec::Default => None,
            LaunchSpec::Fma { tuning, .. } => Some(CubeLaunch::Fma(tuning)),
            LaunchSpec::Dot(d) => Some(CubeLaunch::Dot(d)),
        };
        Tuning {
            cube,
            host_threads: threads,
        }
    }

    /// The read kernel's loads in flight per thread.
    pub fn read_unroll(&self) -> usize {
        match *self {
            LaunchSpec::Fma { read_unroll, .. } => read_unroll,
            _ => READ_UNROLL,
        }
    }

    /// The label of an arm over `w` (tuned by this spec) with `t` activation rows (`t = 0`:
    /// the read kernel, labelled with the FMA shape of `t = 1`): the kernel and shape it runs,
    /// in the form `--tunings` reads; `None` off CubeCL devices.
    pub fn label(&self, w: &Q8Weight, t: usize) -> Option<String> {
        let launch = w.planned_launch(t.max(1))?;
        let launch = match (t, launch, *self) {
            (0, _, LaunchSpec::Fma { tuning, .. }) => CubeLaunch::Fma(tuning),
            (0, _, _) => CubeLaunch::Fma(CubeTuning::default_for(1)),
            (_, launch, _) => launch,
        };
        Some(match launch {
            CubeLaunch::Fma(f) => format!(
                "{}.{}.{}.{}.{}.{}",
                f.lanes,
                f.groups,
                f.rows,
                f.unroll,
                self.read_unroll(),
                f.vector
            ),
            CubeLaunch::Dot(d) => format!("dot.{}.{}.{}.{}", d.lanes, d.groups, d.rows, d.unroll),
        })
    }
}

/// The dot-separated counts of `spec`, if they are `lens` many (one of them).
fn counts(spec: &str, lens: &[usize]) -> Option<Vec<usize>> {
    spec.split('.')
        .map(|s| s.parse::<usize>())
        .collect::<Result<Vec<_>, _>>()
        .ok()
        .filter(|v| lens.contains(&v.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_parses_and_bad_ones_are_refused() {
        assert_eq!(LaunchSpec::parse("default").unwrap(), LaunchSpec::Default);
        let fma = LaunchSpec::parse("32.8.4.1.2").unwrap();
        assert_eq!(
            fma,
            LaunchSpec::Fma {
                tuning: CubeTuning {
                    lanes: 32,
                    groups: 8,
                    rows: 4,
                    unroll: 1,
                    vector: 4
                },
                read_unroll: 2
            }
        );
        assert_eq!(fma.read_unroll(), 2);
        let dot = LaunchSpec::parse("dot.32.4.6.1").unwrap();
        assert_eq!(dot, LaunchSpec::Dot(DotTuning::MANY));
        assert_eq!(dot.read_unroll(), READ_UNROLL);
        for bad in [
            "mma.2.8.2",
            "32.8.4",
            "dot.32.4.6",
            "32.8.4.1.0",
            "x.1.2.3.4",
        ] {
            assert!(LaunchSpec::parse(bad).is_err(), "{bad}");
        }
    }
}
