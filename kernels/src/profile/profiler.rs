//! [`Profiled`]: a [`Device`] that forwards every call to the device it
//! wraps and, when asked, records timing events around them, so that a
//! step's GPU time is split by phase ([`Phase`], marked by the model) or by
//! call (every launch, GEMM, copy and fill), graphs on or off.
//!
//! Modes ([`ProfileMode`]):
//! - `Off`: calls are forwarded, nothing is recorded (the phase marks cost a
//!   field write);
//! - `Phases`: an event where the phase changes and one at the end of the
//!   sequence: inside a capture they become event-record nodes of the graph
//!   (the graph then times itself at every replay), outside they are
//!   recorded as the calls are issued;
//! - `Calls`: an event before and after every call (the ten slowest
//!   kernels; with graphs off it includes the host's launch gaps, which is
//!   what a graphs-off step pays).
//!
//! A mode applies to what is issued or captured after it is set: a graph
//! captured in another mode keeps its own events, so the model's graphs are
//! recaptured after a change (`GpuModel::forget_graphs`).
//!
//! What is timed: the sequence issued between two synchronisations (direct
//! calls, and each graph launched, with the tape captured with it) is read
//! at the synchronisation as one step, when collecting
//! ([`Profiled::start_collecting`]). The spans of one step are contiguous in
//! `Phases` mode (a phase's time runs to the next phase's first call), so
//! they add up to the step's GPU time.
//!
//! Invariants: the wrapper never changes what runs or its order (events are
//! stream-ordered markers); an event belongs to one tape at a time (a
//! direct tape's events return to the pool once read, a graph's stay with it
//! until [`Profiled::forget_graphs`]); events are created outside captures
//! only ([`EVENTS_PER_CAPTURE`] are made ready before each capture).

use crate::device::{
    Arg, DType, DevPtr, Device, DeviceError, DeviceResult, EventId, Gemm, GraphId, HostBuf,
    KernelId, Phase,
};
use std::cell::RefCell;
use std::collections::HashMap;

/// Events made ready before a capture: two per call of the largest step in
/// `Calls` mode (Hibiki-Zero 3B issues about 1,500 calls per step).
pub const EVENTS_PER_CAPTURE: usize = 8192;

/// What the profiler records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProfileMode {
    /// Nothing.
    Off,
    /// An event at each phase change.
    Phases,
    /// Events around every call.
    Calls,
}

/// What a span covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Label {
    /// A run of calls of one phase (`Phases` mode).
    Run,
    /// A kernel launch.
    Kernel(u32),
    /// A GEMM `m × n × k` with A/B and C types.
    Gemm {
        /// Rows.
        m: usize,
        /// Columns.
        n: usize,
        /// Depth.
        k: usize,
        /// A and B's type.
        ab: DType,
        /// C's type.
        c: DType,
    },
    /// A copy host → device.
    ToDevice,
    /// A copy device → host.
    ToHost,
    /// A copy device → device.
    OnDevice,
    /// A fill.
    Zero,
}

/// A timed stretch of a tape.
#[derive(Debug, Clone)]
struct Span {
    phase: Phase,
    label: Label,
    calls: u32,
    start: EventId,
    end: Option<EventId>,
}

/// The spans of one direct sequence or one captured graph.
#[derive(Debug, Clone, Default)]
struct Tape {
    spans: Vec<Span>,
    events: Vec<EventId>,
}

/// What ran since the last synchronisation.
#[derive(Debug)]
enum Pending {
    Direct(Tape),
    Graph(u32),
}

/// One timed step: GPU time from its first to its last event, and per
/// phase the time and the number of calls.
#[derive(Debug, Clone, PartialEq)]
pub struct StepSample {
    /// Sum of the spans of every sequence of the step (ms).
    pub gpu_ms: f64,
    /// Per phase (indexed as [`Phase::ALL`]): ms and calls.
    pub phases: Vec<(f64, u32)>,
}

/// Per-call totals over the collected steps (`Calls` mode).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallTotal {
    /// Sum of the calls' times (ms).
    pub ms: f64,
    /// Calls.
    pub count: u64,
}

/// What a collection gathered.
#[derive(Debug, Clone, Default)]
pub struct Collected {
    /// One per synchronisation that had timed work.
    pub steps: Vec<StepSample>,
    /// By (phase, call label as text).
    pub calls: HashMap<(Phase, String), CallTotal>,
    /// The first failure to read the events (the steps themselves went on).
    pub error: Option<String>,
}

/// Index of `p` in [`Phase::ALL`].
pub fn phase_index(p: Phase) -> usize {
    Phase::ALL
        .iter()
        .position(|&q| q == p)
        .expect("Phase::ALL lists every phase")
}

/// The profiling wrapper (see the module doc).
pub struct Profiled<D: Device> {
    inner: D,
    mode: ProfileMode,
    phase: Phase,
    names: RefCell<HashMap<u32, String>>,
    free: Vec<EventId>,
    tape: Tape,
    capturing: bool,
    graph_tapes: HashMap<u32, Tape>,
    pending: Vec<Pending>,
    collected: Option<Collected>,
}

impl<D: Device> Profiled<D> {
    /// Wraps `inner`, profiling off.
    pub fn new(inner: D) -> Self {
        Profiled {
            inner,
            mode: ProfileMode::Off,
            phase: Phase::Other,
            names: RefCell::new(HashMap::new()),
            free: Vec::new(),
            tape: Tape::default(),
            capturing: false,
            graph_tapes: HashMap::new(),
            pending: Vec::new(),
            collected: None,
        }
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// The wrapped device, mutably (calls made on it directly are not timed).
    pub fn inner_mut(&mut self) -> &mut D {
        &mut self.inner
    }

    /// The mode of what is issued or captured from now on.
    pub fn set_mode(&mut self, mode: ProfileMode) {
        self.mode = mode;
    }

    /// The current mode.
    pub fn mode(&self) -> ProfileMode {
        self.mode
    }

    /// Starts gathering steps (dropping what was gathered).
    pub fn start_collecting(&mut self) {
        self.collected = Some(Collected::default());
    }

    /// Stops gathering and returns what was gathered.
    pub fn take_collected(&mut self) -> Collected {
        self.collected.take().unwrap_or_default()
    }

    /// Returns the events of every captured graph's tape to the pool: for
    /// when the model drops its graphs (they are never launched again).
    pub fn forget_graphs(&mut self) {
        for (_, t) in self.graph_tapes.drain() {
            self.free.extend(t.events);
        }
    }

    fn take_event(&mut self) -> DeviceResult<EventId> {
        if let Some(e) = self.free.pop() {
            return Ok(e);
        }
        if self.capturing {
            return Err(DeviceError::Capture(format!(
                "the profiler ran out of events: more than {EVENTS_PER_CAPTURE} in one capture"
            )));
        }
        self.inner.event_create()
    }

    fn record(&mut self) -> DeviceResult<EventId> {
        let e = self.take_event()?;
        self.tape.events.push(e);
        self.inner.event_record(e)?;
        Ok(e)
    }

    /// Issues one call under the current mode.
    fn timed(
        &mut self,
        label: Label,
        f: impl FnOnce(&mut D) -> DeviceResult<()>,
    ) -> DeviceResult<()> {
        let phase = match label {
            Label::ToDevice | Label::ToHost => Phase::Copies,
            _ => self.phase,
        };
        let r = self.timed_inner(phase, label, f);
        if r.is_err() && self.capturing {
            // The device discarded the capture: so does the profiler.
            self.capturing = false;
            let t = std::mem::take(&mut self.tape);
            self.free.extend(t.events);
        }
        r
    }

    fn timed_inner(
        &mut self,
        phase: Phase,
        label: Label,
        f: impl FnOnce(&mut D) -> DeviceResult<()>,
    ) -> DeviceResult<()> {
        match self.mode {
            ProfileMode::Off => f(&mut self.inner),
            ProfileMode::Phases => {
                let same = self.tape.spans.last().is_some_and(|s| s.phase == phase);
                if !same {
                    let e = self.record()?;
                    if let Some(last) = self.tape.spans.last_mut() {
                        last.end = Some(e);
                    }
                    self.tape.spans.push(Span {
                        phase,
                        label: Label::Run,
                        calls: 0,
                        start: e,
                        end: None,
                    });
                }
                if let Some(last) = self.tape.spans.last_mut() {
                    last.calls += 1;
                }
                f(&mut self.inner)
            }
            ProfileMode::Calls => {
                let start = self.record()?;
                f(&mut self.inner)?;
                let end = self.record()?;
                self.tape.spans.push(Span {
                    phase,
                    label,
                    calls: 1,
                    start,
                    end: Some(end),
                });
                Ok(())
            }
        }
    }

    /// Ends the tape being built: its last open span ends at a new event.
    fn close_tape(&mut self) -> DeviceResult<Tape> {
        if self.tape.spans.last().is_some_and(|s| s.end.is_none()) {
            let e = self.record()?;
            if let Some(last) = self.tape.spans.last_mut() {
                last.end = Some(e);
            }
        }
        Ok(std::mem::take(&mut self.tape))
    }

    fn close_direct(&mut self) -> DeviceResult<()> {
        let t = self.close_tape()?;
        if t.spans.is_empty() {
            self.free.extend(t.events);
        } else {
            self.pending.push(Pending::Direct(t));
        }
        Ok(())
    }

    /// After a synchronisation: reads what ran (when collecting) and
    /// returns direct tapes' events to the pool. A failure to read is kept
    /// in the collection, not returned.
    fn read_pending(&mut self) -> DeviceResult<()> {
        let pending = std::mem::take(&mut self.pending);
        let mut sample = StepSample {
            gpu_ms: 0.0,
            phases: vec![(0.0, 0); Phase::ALL.len()],
        };
        let mut calls = Vec::new();
        let mut result = Ok(());
        if self.collected.is_some() {
            let names = self.names.borrow();
            for p in &pending {
                let tape = match p {
                    Pending::Direct(t) => Some(t),
                    Pending::Graph(g) => self.graph_tapes.get(g),
                };
                if let Some(t) = tape {
                    result = read_tape(&mut self.inner, &names, t, &mut sample, &mut calls);
                    if result.is_err() {
                        break;
                    }
                }
            }
        }
        for p in pending {
            if let Pending::Direct(t) = p {
                self.free.extend(t.events);
            }
        }
        if let Some(c) = &mut self.collected {
            // Timing must never fail the step it times: kept for the report.
            if let Err(e) = result {
                c.error.get_or_insert_with(|| e.to_string());
                return Ok(());
            }
            if sample.phases.iter().any(|p| p.1 > 0) {
                c.steps.push(sample);
                for (phase, label, ms) in calls {
                    let e = c.calls.entry((phase, label)).or_default();
                    e.ms += ms;
                    e.count += 1;
                }
            }
        }
        Ok(())
    }
}

/// A call's label as text: a kernel's name, a GEMM's shape.
fn label_text(names: &HashMap<u32, String>, l: Label) -> String {
    match l {
        Label::Run => "run".into(),
        Label::Kernel(id) => names
            .get(&id)
            .cloned()
            .unwrap_or_else(|| format!("kernel #{id}")),
        Label::Gemm { m, n, k, ab, c } => {
            let t = |d: DType| match d {
                DType::F32 => "f32",
                DType::Bf16 => "bf16",
            };
            format!("gemm {m}x{n}x{k} {}->{}", t(ab), t(c))
        }
        Label::ToDevice => "copy host->device".into(),
        Label::ToHost => "copy device->host".into(),
        Label::OnDevice => "copy device->device".into(),
        Label::Zero => "fill zero".into(),
    }
}

/// Reads the spans of `t` into `sample` and `calls`.
fn read_tape<D: Device>(
    dev: &mut D,
    names: &HashMap<u32, String>,
    t: &Tape,
    sample: &mut StepSample,
    calls: &mut Vec<(Phase, String, f64)>,
) -> DeviceResult<()> {
    let (Some(first), Some(last)) = (t.spans.first(), t.spans.last()) else {
        return Ok(());
    };
    let end_of = |s: &Span| s.end.unwrap_or(s.start);
    sample.gpu_ms += f64::from(dev.event_elapsed_ms(first.start, end_of(last))?);
    for s in &t.spans {
        let ms = f64::from(dev.event_elapsed_ms(s.start, end_of(s))?);
        let slot = &mut sample.phases[phase_index(s.phase)];
        slot.0 += ms;
        slot.1 += s.calls;
        if s.label != Label::Run {
            calls.push((s.phase, label_text(names, s.label), ms));
        }
    }
    Ok(())
}

impl<D: Device> Device for Profiled<D> {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn memory(&self) -> DeviceResult<(usize, usize)> {
        self.inner.memory()
    }
    fn alloc(&mut self, bytes: usize) -> DeviceResult<DevPtr> {
        self.inner.alloc(bytes)
    }
    fn alloc_host(&mut self, bytes: usize) -> DeviceResult<HostBuf> {
        self.inner.alloc_host(bytes)
    }
    fn upload(&mut self, dst: DevPtr, src: &[u8]) -> DeviceResult<()> {
        self.inner.upload(dst, src)
    }
    fn download(&mut self, src: DevPtr, dst: &mut [u8]) -> DeviceResult<()> {
        self.inner.download(src, dst)
    }
    fn copy_to_device(
        &mut self,
        dst: DevPtr,
        src: &HostBuf,
        src_offset: usize,
        bytes: usize,
    ) -> DeviceResult<()> {
        self.timed(Label::ToDevice, |d| {
            d.copy_to_device(dst, src, src_offset, bytes)
        })
    }
    fn copy_to_host(
        &mut self,
        dst: &HostBuf,
        dst_offset: usize,
        src: DevPtr,
        bytes: usize,
    ) -> DeviceResult<()> {
        self.timed(Label::ToHost, |d| {
            d.copy_to_host(dst, dst_offset, src, bytes)
        })
    }
    fn copy_on_device(&mut self, dst: DevPtr, src: DevPtr, bytes: usize) -> DeviceResult<()> {
        self.timed(Label::OnDevice, |d| d.copy_on_device(dst, src, bytes))
    }
    fn memset_zero(&mut self, dst: DevPtr, bytes: usize) -> DeviceResult<()> {
        self.timed(Label::Zero, |d| d.memset_zero(dst, bytes))
    }
    fn kernel(&self, name: &str) -> DeviceResult<KernelId> {
        let id = self.inner.kernel(name)?;
        self.names.borrow_mut().insert(id.0, name.to_string());
        Ok(id)
    }
    fn launch(
        &mut self,
        kernel: KernelId,
        grid: (u32, u32, u32),
        block: u32,
        args: &[Arg],
    ) -> DeviceResult<()> {
        self.timed(Label::Kernel(kernel.0), |d| {
            d.launch(kernel, grid, block, args)
        })
    }
    fn gemm(&mut self, g: &Gemm) -> DeviceResult<()> {
        let label = Label::Gemm {
            m: g.m,
            n: g.n,
            k: g.k,
            ab: g.a_type,
            c: g.c_type,
        };
        self.timed(label, |d| d.gemm(g))
    }
    fn synchronize(&mut self) -> DeviceResult<()> {
        if !self.capturing {
            self.close_direct()?;
        }
        self.inner.synchronize()?;
        self.read_pending()
    }
    fn begin_capture(&mut self) -> DeviceResult<()> {
        if self.mode != ProfileMode::Off && !self.capturing {
            self.close_direct()?;
            while self.free.len() < EVENTS_PER_CAPTURE {
                let e = self.inner.event_create()?;
                self.free.push(e);
            }
        }
        self.inner.begin_capture()?;
        self.capturing = true;
        Ok(())
    }
    fn end_capture(&mut self) -> DeviceResult<GraphId> {
        let closed = if self.capturing {
            self.close_tape()
        } else {
            Ok(Tape::default())
        };
        self.capturing = false;
        let g = self.inner.end_capture();
        match (closed, g) {
            (Ok(t), Ok(g)) => {
                if let Some(old) = self.graph_tapes.insert(g.0, t) {
                    self.free.extend(old.events);
                }
                Ok(g)
            }
            (Ok(t), Err(e)) => {
                self.free.extend(t.events);
                Err(e)
            }
            (Err(e), _) => Err(e),
        }
    }
    fn launch_graph(&mut self, graph: GraphId) -> DeviceResult<()> {
        if !self.capturing {
            self.close_direct()?;
        }
        self.inner.launch_graph(graph)?;
        self.pending.push(Pending::Graph(graph.0));
        Ok(())
    }
    fn phase(&mut self, phase: Phase) {
        self.phase = phase;
        self.inner.phase(phase);
    }
    fn event_create(&mut self) -> DeviceResult<EventId> {
        self.inner.event_create()
    }
    fn event_record(&mut self, event: EventId) -> DeviceResult<()> {
        self.inner.event_record(event)
    }
    fn event_elapsed_ms(&mut self, start: EventId, end: EventId) -> DeviceResult<f32> {
        self.inner.event_elapsed_ms(start, end)
    }
    fn graph_nodes(&self, graph: GraphId) -> Option<usize> {
        self.inner.graph_nodes(graph)
    }
    fn multiprocessors(&self) -> usize {
        self.inner.multiprocessors()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::emu::EmuDevice;

    /// Two phases of fills and a copy, captured and replayed, then direct:
    /// calls land in their phases (copies in `copies` whatever the mark),
    /// the phases' spans add up to the step, a graph's events serve every
    /// replay, and per-call labels name the calls.
    #[test]
    fn phases_and_calls_are_timed_in_graphs_and_directly() {
        let mut d = Profiled::new(EmuDevice::new());
        let a = d.alloc(1 << 16).unwrap();
        let host = d.alloc_host(1 << 10).unwrap();
        let issue = |d: &mut Profiled<EmuDevice>| {
            d.phase(Phase::LmGemm);
            d.memset_zero(a, 1 << 16).unwrap();
            d.memset_zero(a, 1 << 15).unwrap();
            d.copy_to_host(&host, 0, a, 1 << 10).unwrap();
            d.phase(Phase::LmAttn);
            d.memset_zero(a, 1 << 14).unwrap();
        };
        for mode in [ProfileMode::Phases, ProfileMode::Calls] {
            d.set_mode(mode);
            d.begin_capture().unwrap();
            issue(&mut d);
            let g = d.end_capture().unwrap();
            d.start_collecting();
            for _ in 0..3 {
                d.launch_graph(g).unwrap();
                d.synchronize().unwrap();
            }
            issue(&mut d);
            d.synchronize().unwrap();
            let c = d.take_collected();
            assert!(c.error.is_none(), "{c:?}");
            assert_eq!(c.steps.len(), 4, "{mode:?}");
            for s in &c.steps {
                let calls = |p| s.phases[phase_index(p)].1;
                assert_eq!(
                    (
                        calls(Phase::LmGemm),
                        calls(Phase::Copies),
                        calls(Phase::LmAttn)
                    ),
                    (2, 1, 1),
                    "{mode:?}"
                );
                let sum: f64 = s.phases.iter().map(|p| p.0).sum();
                assert!(s.gpu_ms >= 0.0 && sum >= 0.0);
                if mode == ProfileMode::Phases {
                    // Contiguous spans: they add up to the step.
                    assert!((sum - s.gpu_ms).abs() < 1e-3, "{sum} vs {}", s.gpu_ms);
                }
            }
            if mode == ProfileMode::Calls {
                let fills = &c.calls[&(Phase::LmGemm, "fill zero".to_string())];
                assert_eq!(fills.count, 8);
                assert_eq!(
                    c.calls[&(Phase::Copies, "copy device->host".to_string())].count,
                    4
                );
            } else {
                assert!(c.calls.is_empty());
            }
            d.forget_graphs();
        }
        // Off: nothing is gathered, calls still run.
        d.set_mode(ProfileMode::Off);
        d.start_collecting();
        issue(&mut d);
        d.synchronize().unwrap();
        assert!(d.take_collected().steps.is_empty());
    }
}
