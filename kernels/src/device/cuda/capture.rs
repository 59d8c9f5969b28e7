//! CUDA graphs: stream capture (in thread-local mode), instantiation and
//! upload at `end_capture`, graph launches, and the discarding of a capture
//! that a refused or failed call has spoilt.
//!
//! Invariants: `capturing` is true exactly while the stream is capturing; a
//! call that cannot be captured is refused ([`DeviceError::Capture`]) before
//! the driver sees it, and any error while capturing ends and discards the
//! capture, so the stream is usable again and `end_capture` then fails. A
//! graph launch is refused while capturing (the driver cannot capture one).
//! A captured graph is destroyed once instantiated; its executable lives
//! until the device is dropped.

use super::calls::{bind_for_cleanup, call, guarded};
use super::CudaDevice;
use crate::device::{DeviceError, DeviceResult, GraphId};
use cudarc::driver::sys;

/// The capture mode (see the module doc).
const CAPTURE_MODE: sys::CUstreamCaptureMode =
    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;

impl CudaDevice {
    /// Refuses a call that cannot be captured, discarding the capture (as
    /// the emulator does).
    pub(super) fn not_capturing(&mut self, what: &str) -> DeviceResult<()> {
        if self.capturing {
            self.abort_capture();
            Err(DeviceError::Capture(format!(
                "{what} cannot be captured (allocate and upload before begin_capture); \
                 the capture is discarded"
            )))
        } else {
            Ok(())
        }
    }

    /// Passes `r` through; an error while capturing also ends and discards the capture.
    pub(super) fn checked<T>(&mut self, r: DeviceResult<T>) -> DeviceResult<T> {
        if r.is_err() && self.capturing {
            self.abort_capture();
        }
        r
    }

    pub(super) fn abort_capture(&mut self) {
        self.capturing = false;
        let stream = self.cu_stream();
        let _ = guarded("cuStreamEndCapture", || {
            bind_for_cleanup(&self.ctx);
            // SAFETY: our stream; ending a capture (valid or invalidated)
            // returns its graph, or null, which is destroyed at once.
            unsafe {
                if let Ok(g) = cudarc::driver::result::stream::end_capture(stream) {
                    if !g.is_null() {
                        let _ = cudarc::driver::result::graph::destroy(g);
                    }
                }
            }
        });
    }

    pub(super) fn begin_capture_inner(&mut self) -> DeviceResult<()> {
        if self.capturing {
            self.abort_capture();
            return Err(DeviceError::Capture(
                "begin_capture while capturing (the capture is discarded)".into(),
            ));
        }
        self.bind()?;
        let stream = self.cu_stream();
        // SAFETY: our stream, not capturing (tracked by `capturing`).
        call("cuStreamBeginCapture", || unsafe {
            cudarc::driver::result::stream::begin_capture(stream, CAPTURE_MODE)
        })?;
        self.capturing = true;
        Ok(())
    }

    pub(super) fn end_capture_inner(&mut self) -> DeviceResult<GraphId> {
        if !self.capturing {
            return Err(DeviceError::Capture(
                "end_capture without begin_capture (or the capture failed and was discarded)"
                    .into(),
            ));
        }
        if let Err(e) = self.bind() {
            self.abort_capture();
            return Err(e);
        }
        self.capturing = false;
        let stream = self.cu_stream();
        // SAFETY: our stream, capturing since `begin_capture`.
        let graph = call("cuStreamEndCapture", || unsafe {
            cudarc::driver::result::stream::end_capture(stream)
        })?;
        if graph.is_null() {
            return Err(DeviceError::Capture("the capture produced no graph".into()));
        }
        let mut nodes = 0usize;
        // SAFETY: the live graph just captured; with a null array the call
        // only writes the node count. A failure leaves the count at 0.
        let _ = guarded("cuGraphGetNodes", || unsafe {
            sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut nodes)
        });
        // SAFETY: `graph` is the live graph just captured; it is destroyed
        // once, here, whether instantiation worked or not (an executable
        // graph does not depend on its source graph).
        let exec = call("cuGraphInstantiateWithFlags", || unsafe {
            let exec =
                cudarc::driver::result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0));
            let _ = cudarc::driver::result::graph::destroy(graph);
            exec
        })?;
        // SAFETY: a live executable graph and our stream: uploading it now
        // spares the first launch the set-up.
        let uploaded = call("cuGraphUpload", || unsafe {
            cudarc::driver::result::graph::upload(exec, stream)
        });
        if let Err(e) = uploaded {
            // SAFETY: `exec` is live and not recorded anywhere else.
            let _ = guarded("cuGraphExecDestroy", || unsafe {
                cudarc::driver::result::graph::exec_destroy(exec)
            });
            return Err(e);
        }
        let id = u32::try_from(self.graphs.len())
            .map_err(|_| DeviceError::Capture("too many graphs".into()))?;
        self.graphs.push(exec);
        self.graph_nodes.push(nodes);
        Ok(GraphId(id))
    }

    pub(super) fn launch_graph_inner(&mut self, graph: GraphId) -> DeviceResult<()> {
        let exec = *self
            .graphs
            .get(graph.0 as usize)
            .ok_or_else(|| DeviceError::Capture(format!("no graph #{}", graph.0)))?;
        if self.capturing {
            // The driver refuses a graph launch into a capturing stream
            // (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); say so plainly.
            return Err(DeviceError::Capture(
                "launch_graph while capturing: CUDA cannot capture a graph launch \
                     (the capture is discarded)"
                    .into(),
            ));
        }
        self.bind()?;
        let stream = self.cu_stream();
        // SAFETY: a live executable graph of this device, on our stream;
        // graph launches are serialised by `&mut self`.
        call("cuGraphLaunch", || unsafe {
            cudarc::driver::result::graph::launch(exec, stream)
        })
    }
}

/// GPU tests: run by `scripts/gpu-check` (`--include-ignored`).
#[cfg(test)]
mod tests {
    use super::super::gpu_test::{bytes_of, det, floats, open};
    use crate::device::{Arg, Device, DeviceError};

    #[test]
    #[ignore = "needs a GPU (scripts/gpu-check)"]
    fn a_captured_memset_kernel_and_copy_replay() {
        let mut d = open();
        let n = 1000usize;
        let add = d.kernel("add_f32").unwrap();
        let x = d.alloc(n * 4).unwrap();
        let u = d.alloc(n * 4).unwrap();
        let mut input = d.alloc_host(n * 4).unwrap();
        let output = d.alloc_host(n * 4).unwrap();
        // x starts non-zero, so the captured memset is seen to run.
        d.upload(x, &bytes_of(&vec![100.0; n])).unwrap();
        d.synchronize().unwrap();

        // Not capturable: refused, and the capture is discarded (as on
        // the emulator), so the stream is usable again.
        d.begin_capture().unwrap();
        assert!(matches!(d.alloc(16), Err(DeviceError::Capture(_))));
        assert!(matches!(d.end_capture(), Err(DeviceError::Capture(_))));
        d.begin_capture().unwrap();
        assert!(matches!(d.synchronize(), Err(DeviceError::Capture(_))));
        assert!(matches!(d.end_capture(), Err(DeviceError::Capture(_))));
        d.begin_capture().unwrap();
        assert!(matches!(d.begin_capture(), Err(DeviceError::Capture(_))));
        assert!(matches!(d.end_capture(), Err(DeviceError::Capture(_))));
        d.synchronize().unwrap();

        d.begin_capture().unwrap();
        d.memset_zero(x, n * 4).unwrap();
        d.copy_to_device(u, &input, 0, n * 4).unwrap();
        // add_f32 is grid-stride over n with EW_THREADS (256) per block.
        let grid = (n.div_ceil(256) as u32, 1, 1);
        d.launch(
            add,
            grid,
            256,
            &[Arg::Ptr(x), Arg::Ptr(u), Arg::U64(n as u64)],
        )
        .unwrap();
        d.launch(
            add,
            grid,
            256,
            &[Arg::Ptr(x), Arg::Ptr(u), Arg::U64(n as u64)],
        )
        .unwrap();
        d.copy_to_host(&output, 0, x, n * 4).unwrap();
        let g = d.end_capture().unwrap();
        // Nothing ran at capture time.
        let mut now = vec![0u8; n * 4];
        d.download(x, &mut now).unwrap();
        assert!(floats(&now).iter().all(|&v| v == 100.0));

        for round in 0..3 {
            let v = det(n, round as f32);
            input.slice_mut::<f32>(0, n).copy_from_slice(&v);
            d.launch_graph(g).unwrap();
            d.synchronize().unwrap();
            let got = output.slice::<f32>(0, n);
            for (e, (&g, &v)) in got.iter().zip(&v).enumerate() {
                assert_eq!(g, v + v, "round {round} element {e}");
            }
        }
        // A graph launch cannot be captured: refused, capture discarded.
        d.begin_capture().unwrap();
        assert!(matches!(d.launch_graph(g), Err(DeviceError::Capture(_))));
        assert!(matches!(d.end_capture(), Err(DeviceError::Capture(_))));
        // Wrong argument lists and stray pointers are refused before the
        // driver sees them.
        assert!(matches!(
            d.launch(
                add,
                grid,
                256,
                &[Arg::Ptr(x), Arg::Ptr(0x10), Arg::U64(n as u64)]
            ),
            Err(DeviceError::Shape { .. })
        ));
        assert!(matches!(
            d.launch(add, grid, 256, &[Arg::Ptr(x), Arg::Ptr(u), Arg::U32(1)]),
            Err(DeviceError::Shape { .. })
        ));
        assert!(matches!(
            d.launch(add, grid, 256, &[Arg::Ptr(x), Arg::Ptr(u)]),
            Err(DeviceError::Shape { .. })
        ));
        assert!(matches!(d.end_capture(), Err(DeviceError::Capture(_))));
    }

    /// The profiler's premise: events recorded inside a capture become
    /// nodes of the graph that record at every replay, with timing.
    #[test]
    #[ignore = "needs a GPU (scripts/gpu-check)"]
    fn events_in_a_captured_graph_time_its_replays() {
        let mut d = open();
        let n = 1 << 24;
        let add = d.kernel("add_f32").unwrap();
        let x = d.alloc(n * 4).unwrap();
        let u = d.alloc(n * 4).unwrap();
        let (a, b) = (d.event_create().unwrap(), d.event_create().unwrap());
        d.begin_capture().unwrap();
        d.event_record(a).unwrap();
        let grid = (n.div_ceil(256) as u32, 1, 1);
        for _ in 0..4 {
            d.launch(
                add,
                grid,
                256,
                &[Arg::Ptr(x), Arg::Ptr(u), Arg::U64(n as u64)],
            )
            .unwrap();
        }
        d.event_record(b).unwrap();
        let g = d.end_capture().unwrap();
        assert!(d.graph_nodes(g).unwrap() >= 6, "{:?}", d.graph_nodes(g));
        for _ in 0..3 {
            d.launch_graph(g).unwrap();
            d.synchronize().unwrap();
            let ms = d.event_elapsed_ms(a, b).unwrap();
            // 4 passes over 3 × 64 MiB: well above 10 µs on any GPU.
            assert!(ms > 0.01 && ms < 1000.0, "{ms} ms");
            println!("4 adds of 16M floats in a graph: {ms:.3} ms");
        }
    }
}
