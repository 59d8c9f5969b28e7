//! Timing events for the profiler: created with timing on, recorded on the
//! device's stream (as external event-record nodes while capturing, so that
//! a graph records them at every replay), read after a synchronisation.
//!
//! Invariants: every event is created by this device and destroyed once,
//! when the device is released; an [`EventId`] indexes `events`.

use super::calls::call;
use super::CudaDevice;
use crate::device::{DeviceError, DeviceResult, EventId};
use cudarc::driver::sys;

impl CudaDevice {
    fn event(&self, e: EventId) -> DeviceResult<sys::CUevent> {
        self.events
            .get(e.0 as usize)
            .copied()
            .ok_or_else(|| DeviceError::shape("event", format!("no event #{}", e.0)))
    }

    pub(super) fn event_create_inner(&mut self) -> DeviceResult<EventId> {
        self.not_capturing("event_create")?;
        self.bind()?;
        let id = u32::try_from(self.events.len())
            .map_err(|_| DeviceError::shape("event_create", "too many events"))?;
        let e = call("cuEventCreate", || {
            cudarc::driver::result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
        })?;
        self.events.push(e);
        Ok(EventId(id))
    }

    pub(super) fn event_record_inner(&mut self, e: EventId) -> DeviceResult<()> {
        let ev = self.event(e)?;
        self.bind()?;
        let flags = if self.capturing {
            sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL
        } else {
            sys::CUevent_record_flags::CU_EVENT_RECORD_DEFAULT
        };
        let stream = self.cu_stream();
        // SAFETY: an event of this device (live until it is released) on
        // our stream.
        call("cuEventRecordWithFlags", || unsafe {
            sys::cuEventRecordWithFlags(ev, stream, flags as u32).result()
        })
    }

    pub(super) fn event_elapsed_inner(&mut self, a: EventId, b: EventId) -> DeviceResult<f32> {
        let (ea, eb) = (self.event(a)?, self.event(b)?);
        self.bind()?;
        // SAFETY: two live events of this device, recorded on its one stream.
        call("cuEventElapsedTime", || unsafe {
            cudarc::driver::result::event::elapsed(ea, eb)
        })
    }

    /// Destroys every event (at release; the stream is synchronised).
    pub(super) fn destroy_events(&mut self) {
        for e in self.events.drain(..) {
            // SAFETY: created by this device, destroyed once (drained).
            let _ = unsafe { cudarc::driver::result::event::destroy(e) };
        }
    }
}
