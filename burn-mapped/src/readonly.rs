//! Read-only enforcement for adopted bytes.
//!
//! The pages are mapped `PROT_READ`, so a stray store through a raw pointer faults instead of
//! changing the file. Above that, Burn reaches tensor bytes through
//! [`AllocationController`]s; [`MappedController`] serves reads from the mapping in place and
//! answers a request for mutable access in one of two ways:
//! - default: copy-on-write into a private buffer, so Burn's in-place kernels get a fresh
//!   output and return correct values while the file stays untouched;
//! - strict ([`StrictMode`]): refuse immediately, with a message naming the tensor. Burn's
//!   host access turns the refusal into a panic at the call site, which is the point: it shows
//!   which op asked to write a weight.
//!
//! Burn's NdArray backend never asks: it copies borrowed bytes before any op, writes included,
//! so strict mode has nothing to refuse there (the per-use copy, see the crate docs).

pub use crate::fault::SIGBUS_EXIT_CODE;
use std::mem::MaybeUninit;
use std::sync::Arc;

use burn_std::{
    AccessError, AccessPolicy, AllocationController, AllocationProperty, Bytes,
    SharedBytesAllocationController, SplitError,
};

/// Environment variable that turns strict mode on for every store opened after it is set.
pub const STRICT_ENV: &str = "BURN_MAPPED_STRICT";

/// Whether write access to mapped bytes fails (strict) or copies (default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StrictMode {
    /// Writes copy the tensor into private memory first.
    #[default]
    CopyOnWrite,
    /// Writes are refused with an error naming the tensor.
    Strict,
}

impl StrictMode {
    /// `Strict` when `BURN_MAPPED_STRICT` is set to `1`/`true`, else `CopyOnWrite`.
    pub fn from_env() -> Self {
        match std::env::var(STRICT_ENV).as_deref() {
            Ok("1") | Ok("true") | Ok("yes") => StrictMode::Strict,
            _ => StrictMode::CopyOnWrite,
        }
    }
}

/// Prefix of the refusal message, so callers and tests can recognise it.
pub const REFUSAL: &str = "burn-mapped: write access refused to read-only mapped tensor";

/// Serves a tensor's bytes from its mapping.
pub(crate) struct MappedController {
    bytes: bytes::Bytes,
    inner: SharedBytesAllocationController,
    tensor: Arc<str>,
    mode: StrictMode,
}

impl MappedController {
    pub(crate) fn new(bytes: bytes::Bytes, tensor: Arc<str>, mode: StrictMode) -> Self {
        Self {
            inner: SharedBytesAllocationController::new(bytes.clone(), AllocationProperty::File),
            bytes,
            tensor,
            mode,
        }
    }

    /// Burn [`Bytes`] over the mapping, with no copy.
    pub(crate) fn into_burn_bytes(self) -> Bytes {
        let len = self.bytes.len();
        // SAFETY: the controller exposes exactly `len` initialized bytes (the mapped file's
        // logical range), so `len` is the initialized length `from_controller` requires.
        unsafe { Bytes::from_controller(Box::new(self), len) }
    }

    fn sibling(&self, bytes: bytes::Bytes) -> Box<dyn AllocationController> {
        Box::new(Self::new(bytes, Arc::clone(&self.tensor), self.mode))
    }
}

impl AllocationController for MappedController {
    fn alloc_align(&self) -> usize {
        self.inner.alloc_align()
    }

    fn property(&self) -> AllocationProperty {
        AllocationProperty::File
    }

    fn capacity(&self) -> usize {
        self.inner.capacity()
    }

    fn memory(&self, policy: AccessPolicy) -> Result<&[MaybeUninit<u8>], AccessError> {
        self.inner.memory(policy)
    }

    unsafe fn memory_mut(
        &mut self,
        policy: AccessPolicy,
    ) -> Result<&mut [MaybeUninit<u8>], AccessError> {
        if self.mode == StrictMode::Strict {
            return Err(AccessError::Read(format!("{REFUSAL} `{}`", self.tensor)));
        }
        // SAFETY: forwarded with the caller's own obligations; the inner controller copies
        // before handing out mutable memory, so the mapping itself is never written.
        unsafe { self.inner.memory_mut(policy) }
    }

    fn split(
        &mut self,
        offset: usize,
    ) -> Result<(Box<dyn AllocationController>, Box<dyn AllocationController>), SplitError> {
        if offset > self.bytes.len() {
            return Err(SplitError::InvalidOffset);
        }
        // Once copied-on-write the private buffer is what holds the data: splitting the
        // mapping would resurrect stale bytes.
        if self.inner.view(0, 0).is_none() {
            return Err(SplitError::Unsupported);
        }
        Ok((
            self.sibling(self.bytes.slice(..offset)),
            self.sibling(self.bytes.slice(offset..)),
        ))
    }

    fn view(&self, start: usize, end: usize) -> Option<Box<dyn AllocationController>> {
        // `inner.view` is `None` after copy-on-write or for a bad range; same rule here.
        self.inner.view(start, end)?;
        Some(self.sibling(self.bytes.slice(start..end)))
    }

    fn duplicate(&self) -> Option<Box<dyn AllocationController>> {
        self.inner.duplicate()?;
        Some(self.sibling(self.bytes.clone()))
    }

    unsafe fn copy_into(&self, buf: &mut [u8]) {
        // SAFETY: same contract as the caller's.
        unsafe { self.inner.copy_into(buf) }
    }
}
