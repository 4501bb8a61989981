//! Weights onto a wgpu device at the link's speed: each tensor copied from its mapped pages into
//! staging buffers this module keeps and reuses, by several threads at once, then copied by the
//! GPU into the tensor's device buffer.
//!
//! Burn's `from_data` hands the bytes to CubeCL, which writes them with wgpu's `write_buffer`
//! on its device thread: one thread copying each tensor into a staging allocation of its own,
//! and a wait for the GPU every 64 writes. On an H100 a 7B model's weights reached the device
//! at about 4 GB/s that way, a second of its first token (docs/PERFORMANCE.md). Here the
//! staging memory is allocated once per load, the copies into it are spread over threads, and
//! the GPU's copies run behind them, waited for only when a staging buffer comes round again.
//!
//! Registering a device's wgpu handles ([`register`]) turns this on for every load onto that
//! device: [`MappedStore::load_except`](crate::MappedStore::load_except) (so `load_from` too)
//! and [`BlockWeight::from_store`](crate::blocks::BlockWeight::from_store). Where the device is
//! not registered, or CubeCL's buffer for a tensor cannot be reached, a tensor goes through
//! `from_data` as before.

use std::sync::Mutex;
use std::sync::mpsc;

use burn::module::{Module, ModuleMapper, Param, Parameter};
use burn::tensor::{DType, Device, Int, Shape, Tensor};
use burn_cubecl::cubecl::wgpu::{AutoCompiler, WgpuServer, wgpu};
use burn_cubecl::tensor::CubeTensor;

use crate::error::StoreError;
use crate::store::MappedStore;

/// Bytes one staging buffer holds.
const CHUNK: u64 = 64 << 20;
/// Staging buffers in the ring: while the GPU copies from some, threads fill the next.
const SLOTS: usize = 4;
/// Tensors smaller than this keep `from_data`.
const MIN_BYTES: usize = 1 << 20;
/// Threads copying into one staging buffer, at most.
const MAX_THREADS: usize = 8;

type Server = WgpuServer<AutoCompiler>;

/// The wgpu handles of a registered device.
#[derive(Clone)]
struct Handles {
    device: wgpu::Device,
    queue: wgpu::Queue,
}

/// A registered device: its handles, and its staging ring between loads (empty once released).
struct Registered {
    device: Device,
    handles: Handles,
    idle: Vec<Slot>,
}

static REGISTERED: Mutex<Vec<Registered>> = Mutex::new(Vec::new());

/// Loads onto `device` upload through this module from now on. `wgpu_device` and `queue` must
/// be the ones CubeCL runs `device` on (Burn's `Device::wgpu_options().init_with_setup()`
/// returns them): the GPU's copies are ordered with Burn's work on that queue.
pub fn register(device: &Device, wgpu_device: wgpu::Device, queue: wgpu::Queue) {
    let mut registered = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
    registered.retain(|r| &r.device != device);
    registered.push(Registered {
        device: device.clone(),
        handles: Handles {
            device: wgpu_device,
            queue,
        },
        idle: Vec::new(),
    });
}

/// Whether loads onto `device` upload through this module.
pub fn is_registered(device: &Device) -> bool {
    let registered = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
    registered.iter().any(|r| &r.device == device)
}

/// `device`'s handles and its idle staging ring (taken: a load's [`Staging`] holds it until it ends).
fn take(device: &Device) -> Option<(Handles, Vec<Slot>)> {
    let mut registered = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
    let r = registered.iter_mut().find(|r| &r.device == device)?;
    Some((r.handles.clone(), std::mem::take(&mut r.idle)))
}

/// Frees `device`'s staging ring (four 64 MiB host buffers), which the loads onto it keep for
/// one another: a model loads its parameters and its embedding in separate loads. A later load
/// allocates a new ring.
pub fn release_staging(device: &Device) {
    let mut registered = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = registered.iter_mut().find(|r| &r.device == device) {
        r.idle.clear();
    }
}

/// What went through the staging ring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UploadStats {
    /// Tensors uploaded.
    pub tensors: usize,
    /// Bytes uploaded.
    pub bytes: u64,
}

static TOTALS: Mutex<UploadStats> = Mutex::new(UploadStats {
    tensors: 0,
    bytes: 0,
});

/// Tensors and bytes this process has uploaded through the staging ring (all devices): how a
/// caller or a test tells that a load took this path.
pub fn totals() -> UploadStats {
    *TOTALS.lock().unwrap_or_else(|e| e.into_inner())
}

struct Slot {
    buffer: wgpu::Buffer,
    /// The submission copying out of the buffer, until it is mapped again.
    pending: Option<wgpu::SubmissionIndex>,
}

/// One load's uploads onto one device, through the device's staging ring (kept for the next
/// load when it ends, until [`release_staging`]).
pub(crate) struct Staging {
    handles: Handles,
    device: Device,
    slots: Vec<Slot>,
    next: usize,
    /// The latest copy submitted: the queue runs them in order.
    last: Option<wgpu::SubmissionIndex>,
    threads: usize,
    stats: UploadStats,
}

impl Staging {
    /// The staging for a load onto `device`, or `None` where it is not registered.
    pub(crate) fn begin(device: &Device) -> Option<Self> {
        let (handles, slots) = take(device)?;
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(MAX_THREADS);
        Some(Self {
            handles,
            device: device.clone(),
            slots,
            next: 0,
            last: None,
            threads,
            stats: UploadStats::default(),
        })
    }

    /// `bytes` as a new integer tensor of `shape` and `dtype` on the device, or `None` where
    /// it does not take this path (see [`fits`]; or CubeCL does not hand out its buffer): the
    /// caller then uses `from_data`.
    ///
    /// # Errors
    /// [`StoreError::Upload`] when the GPU refuses a step of the copy; the tensor is unusable.
    pub(crate) fn int<const D: usize>(
        &mut self,
        name: &str,
        bytes: &[u8],
        shape: Shape,
        dtype: DType,
    ) -> Result<Option<Tensor<D, Int>>, StoreError> {
        if !fits(bytes, &shape, dtype) {
            return Ok(None);
        }
        let tensor = Tensor::<D, Int>::empty(shape, (&self.device, dtype));
        let Some(cube) = crate::q8::direct::cube_int(&tensor) else {
            return Ok(None);
        };
        Ok(self.fill(name, &cube, bytes)?.then_some(tensor))
    }

    /// As [`int`](Self::int), for a float tensor.
    ///
    /// # Errors
    /// As [`int`](Self::int).
    pub(crate) fn float<const D: usize>(
        &mut self,
        name: &str,
        bytes: &[u8],
        shape: Shape,
        dtype: DType,
    ) -> Result<Option<Tensor<D>>, StoreError> {
        if !fits(bytes, &shape, dtype) {
            return Ok(None);
        }
        let tensor = Tensor::<D>::empty(shape, (&self.device, dtype));
        let Some(cube) = crate::q8::direct::cube_float(&tensor) else {
            return Ok(None);
        };
        Ok(self.fill(name, &cube, bytes)?.then_some(tensor))
    }

    /// Copies `bytes` into `cube`'s buffer; `false` where the buffer cannot be reached or
    /// does not take a copy of this size.
    fn fill(&mut self, name: &str, cube: &CubeTensor, bytes: &[u8]) -> Result<bool, StoreError> {
        let Ok(resource) = cube.client.get_resource::<Server>(cube.handle.clone()) else {
            return Ok(false);
        };
        let resource = resource.resource();
        let padded = (bytes.len() as u64).next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
        if resource.offset % wgpu::COPY_BUFFER_ALIGNMENT != 0
            || resource.size.next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT) < padded
        {
            return Ok(false);
        }
        // Work CubeCL holds unsubmitted (a kernel on memory this buffer reuses) goes first.
        cube.client.flush().map_err(|e| StoreError::Upload {
            tensor: name.to_string(),
            reason: format!("{e:?}"),
        })?;
        let (buffer, offset) = (resource.buffer.clone(), resource.offset);
        for (i, part) in bytes.chunks(CHUNK as usize).enumerate() {
            self.copy(name, part, &buffer, offset + i as u64 * CHUNK)?;
        }
        self.stats.tensors += 1;
        self.stats.bytes += bytes.len() as u64;
        Ok(true)
    }

    /// One chunk: into the next staging buffer on the load's threads, then a GPU copy.
    fn copy(
        &mut self,
        name: &str,
        part: &[u8],
        dst: &wgpu::Buffer,
        dst_offset: u64,
    ) -> Result<(), StoreError> {
        let fail = |reason: String| StoreError::Upload {
            tensor: name.to_string(),
            reason,
        };
        let index = self.next;
        self.next = (self.next + 1) % SLOTS;
        if self.slots.len() <= index {
            let buffer = self.handles.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("burn-mapped upload"),
                size: CHUNK,
                usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: true,
            });
            self.slots.push(Slot {
                buffer,
                pending: None,
            });
        }
        let slot = &mut self.slots[index];
        if let Some(submission) = slot.pending.take() {
            remap(&self.handles.device, &slot.buffer, submission).map_err(fail)?;
        }
        let padded = (part.len() as u64).next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
        {
            let mut view = slot
                .buffer
                .get_mapped_range_mut(0..padded)
                .map_err(|e| fail(e.to_string()))?;
            let (data, mut pad) = view.slice(..).split_at(part.len());
            pad.fill(0);
            copy_parallel(data, part, self.threads);
        }
        slot.buffer.unmap();
        let mut encoder =
            self.handles
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("burn-mapped upload"),
                });
        encoder.copy_buffer_to_buffer(&slot.buffer, 0, dst, dst_offset, padded);
        let submission = self.handles.queue.submit([encoder.finish()]);
        slot.pending = Some(submission.clone());
        self.last = Some(submission);
        Ok(())
    }

    /// Waits for the GPU's copies, adds them to [`totals`] and hands the ring back to the
    /// device's registration.
    ///
    /// # Errors
    /// [`StoreError::Upload`] when waiting for the copies fails.
    pub(crate) fn finish(mut self) -> Result<(), StoreError> {
        if let Some(submission) = self.last.take() {
            self.handles
                .device
                .poll(wgpu::PollType::Wait {
                    submission_index: Some(submission),
                    timeout: None,
                })
                .map_err(|e| StoreError::Upload {
                    tensor: "(the load's last copy)".to_string(),
                    reason: e.to_string(),
                })?;
        }
        let mut totals = TOTALS.lock().unwrap_or_else(|e| e.into_inner());
        totals.tensors += self.stats.tensors;
        totals.bytes += self.stats.bytes;
        drop(totals);
        // The ring waits for the next load, its buffers mapped again as each comes round.
        let mut registered = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = registered.iter_mut().find(|r| r.device == self.device) {
            r.idle = std::mem::take(&mut self.slots);
        }
        Ok(())
    }
}

/// Whether `bytes` are exactly a `shape` of `dtype` (not a dtype Burn widens on the device),
/// and large enough to be worth the round trips to CubeCL's device thread that reaching the
/// tensor's buffer takes (a norm's few kilobytes go faster through `from_data`).
fn fits(bytes: &[u8], shape: &Shape, dtype: DType) -> bool {
    matches!(
        dtype,
        DType::F32 | DType::U8 | DType::I8 | DType::U32 | DType::I32
    ) && bytes.len() >= MIN_BYTES
        && shape.num_elements() * dtype.size() == bytes.len()
}

/// Maps `buffer` for writing once `submission`, the last one reading it, is done.
fn remap(
    device: &wgpu::Device,
    buffer: &wgpu::Buffer,
    submission: wgpu::SubmissionIndex,
) -> Result<(), String> {
    let (tx, rx) = mpsc::channel();
    buffer
        .slice(..)
        .map_async(wgpu::MapMode::Write, move |r| drop(tx.send(r)));
    device
        .poll(wgpu::PollType::Wait {
            submission_index: Some(submission),
            timeout: None,
        })
        .map_err(|e| e.to_string())?;
    loop {
        match rx.try_recv() {
            Ok(result) => return result.map_err(|e| e.to_string()),
            Err(mpsc::TryRecvError::Empty) => {
                device
                    .poll(wgpu::PollType::wait_indefinitely())
                    .map_err(|e| e.to_string())?;
            }
            Err(mpsc::TryRecvError::Disconnected) => {
                return Err("the staging buffer's map was dropped".to_string());
            }
        }
    }
}

/// `dst.copy_from_slice(src)` on up to `threads` threads (the source pages fault in on each).
fn copy_parallel(mut dst: wgpu::WriteOnly<'_, [u8]>, src: &[u8], threads: usize) {
    const MIN_SPAN: usize = 4 << 20;
    assert_eq!(dst.len(), src.len());
    let spans = (src.len() / MIN_SPAN).clamp(1, threads);
    if spans == 1 {
        dst.copy_from_slice(src);
        return;
    }
    let span = src.len().div_ceil(spans);
    let base = Target(dst.as_raw_ptr().cast::<u8>());
    std::thread::scope(|scope| {
        for (i, s) in src.chunks(span).enumerate() {
            scope.spawn(move || {
                // SAFETY: `dst` is a write mapping of `src.len()` bytes that outlives this
                // scope; the spans `i * span .. i * span + s.len()` are disjoint and inside it.
                unsafe {
                    std::ptr::copy_nonoverlapping(s.as_ptr(), base.at(i * span), s.len());
                }
            });
        }
    });
}

/// The start of a staging mapping, handed to the copying threads (each writes its own span).
#[derive(Clone, Copy)]
struct Target(std::ptr::NonNull<u8>);

impl Target {
    /// The byte `offset` in (a method, so a closure captures the whole `Send` value).
    ///
    /// # Safety
    /// `offset` must lie inside the mapping.
    unsafe fn at(self, offset: usize) -> *mut u8 {
        // SAFETY: the caller keeps `offset` inside the mapping.
        unsafe { self.0.as_ptr().add(offset) }
    }
}

// SAFETY: only ever written through disjoint spans, one thread each, within a scope.
unsafe impl Send for Target {}

/// Every parameter of `module` whose store tensor uploads through `staging` (the module's
/// own load transform applied, its lazy initializer never run), except those at the paths in
/// `skip`; the others stay as they were. Returns the module and the paths it loaded.
///
/// # Errors
/// A shape mismatch between a parameter and its tensor, or a failed upload.
pub(crate) fn upload_module<M: Module>(
    store: &MappedStore,
    module: M,
    skip: &[&str],
    staging: &mut Staging,
) -> Result<(M, Vec<String>), StoreError> {
    let mut mapper = Uploads {
        store,
        skip,
        staging,
        path: Vec::new(),
        done: Vec::new(),
        error: None,
    };
    let module = module.map(&mut mapper);
    match mapper.error {
        Some(e) => Err(e),
        None => Ok((module, mapper.done)),
    }
}

struct Uploads<'a> {
    store: &'a MappedStore,
    skip: &'a [&'a str],
    staging: &'a mut Staging,
    path: Vec<String>,
    done: Vec<String>,
    error: Option<StoreError>,
}

impl Uploads<'_> {
    /// `param` with its tensor from `upload`, or as it was where the tensor does not upload
    /// this way (burn-store's applier then loads it, or reports it).
    fn place<T: Parameter>(
        &mut self,
        param: Param<T>,
        rank: usize,
        upload: impl FnOnce(&mut Staging, &str, &[u8], Shape, DType) -> Result<Option<T>, StoreError>,
    ) -> Param<T> {
        if self.error.is_some() {
            return param;
        }
        let name = self.path.join(".");
        if self.skip.contains(&name.as_str()) {
            return param;
        }
        let Some(entry) = self.store.manifest().get(&name) else {
            return param;
        };
        if entry.shape().len() != rank {
            return param;
        }
        let expected = param.lazy_shape();
        if expected.to_vec().as_slice() != entry.shape() {
            self.error = Some(StoreError::ShapeMismatch {
                tensor: name,
                dir: self.store.dir().to_path_buf(),
                expected: expected.to_vec(),
                found: entry.shape().to_vec(),
            });
            return param;
        }
        let bytes = match self.store.bytes(&name) {
            Ok(b) => b,
            Err(e) => {
                self.error = Some(e);
                return param;
            }
        };
        let shape = Shape::from(entry.shape().to_vec());
        match upload(self.staging, &name, bytes, shape, entry.dtype()) {
            Ok(Some(tensor)) => {
                self.done.push(name);
                let id = param.id;
                param.transform_for_load(tensor, id)
            }
            Ok(None) => param,
            Err(e) => {
                self.error = Some(e);
                param
            }
        }
    }
}

impl ModuleMapper for Uploads<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        self.place(param, D, |s, name, bytes, shape, dtype| {
            if dtype.is_float() {
                s.float::<D>(name, bytes, shape, dtype)
            } else {
                Ok(None)
            }
        })
    }

    fn map_int<const D: usize>(&mut self, param: Param<Tensor<D, Int>>) -> Param<Tensor<D, Int>> {
        self.place(param, D, |s, name, bytes, shape, dtype| {
            if dtype.is_int() || dtype.is_uint() {
                s.int::<D>(name, bytes, shape, dtype)
            } else {
                Ok(None)
            }
        })
    }
}
