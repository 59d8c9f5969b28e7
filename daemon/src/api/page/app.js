// The moshid page: talk to the model from a browser.
//
// Microphone (echo cancellation on) → Opus by the browser's WebCodecs
// AudioEncoder → Ogg pages (ogg.js) → /api/chat; the model's Ogg Opus →
// WebCodecs AudioDecoder → the jitter buffer of worklets.js → speakers.
// Text pieces go to the transcript; the session record, sent by the server
// at the end, is shown as a table. Every failure a person can meet ends in a
// sentence in the error box.
//
// Query parameters: `start=1` connects without a click, `token=…` gives the
// access token (then removed from the address bar), `capture=worklet`
// captures through an AudioWorklet even where MediaStreamTrackProcessor
// exists. State for tests and debugging: `window.moshid.snapshot()`.

import { OggOpusWriter, OggReader, opusHead, parseOpusHead, opusPacketSamples48k } from "./ogg.js";

const KIND = { HANDSHAKE: 0x00, AUDIO: 0x01, TEXT: 0x02, CONTROL: 0x03, METADATA: 0x04, ERROR: 0x05 };
const END_OF_INPUT = new Uint8Array([KIND.CONTROL, 0x01]);
const SAMPLE_RATE = 24000;
const OPUS = { codec: "opus", numberOfChannels: 1, bitrate: 32000, opus: { frameDuration: 20000 } };
const FRAME_US = 80000;
// How long a hang-up waits for the server's record before closing anyway.
const END_TIMEOUT_MS = 15000;
// Outgoing bytes the socket may hold before the page calls the link too slow.
const MAX_BUFFERED_BYTES = 256 * 1024;

const $ = (id) => document.getElementById(id);
const ui = {
  model: $("model"), connect: $("connect"), hangup: $("hangup"), status: $("status"), error: $("error"),
  tokenForm: $("token-form"), token: $("token"), audioBlocked: $("audio-blocked"), allowAudio: $("allow-audio"),
  mic: $("mic-level"), latency: $("latency"), buffer: $("buffer"), frames: $("frames"), played: $("played"),
  transcript: $("transcript"), params: $("params-form"), conditioners: $("conditioners"), cfgRow: $("cfg-row"),
  recordBox: $("record-box"), record: $("record"),
};

const query = new URLSearchParams(location.search);
let token = query.get("token") || sessionStorage.getItem("moshid-token") || "";
if (query.has("token")) {
  // Keep the token out of the address bar, history and bookmarks.
  sessionStorage.setItem("moshid-token", token);
  query.delete("token");
  const rest = query.toString();
  history.replaceState(null, "", location.pathname + (rest ? "?" + rest : ""));
}

let model = null;
let session = null;
const errors = [];

function setStatus(text, live = false) {
  ui.status.textContent = text;
  ui.status.classList.toggle("live", live);
}

function showError(text) {
  errors.push(text);
  ui.error.textContent = text;
  ui.error.hidden = false;
}

// `errors` holds what the page has said since the last clear (the snapshot's
// `errors`: what a person sees now, and what came before it that time).
function clearError() {
  errors.length = 0;
  ui.error.hidden = true;
  ui.error.textContent = "";
}

function authHeaders() {
  return token ? { Authorization: "Bearer " + token } : {};
}

// ---- the model description and the parameters form ----

async function loadModel() {
  let res;
  try {
    res = await fetch("/v1/model", { headers: authHeaders(), cache: "no-store" });
  } catch (e) {
    showError("Cannot reach the server: " + e.message);
    setStatus("Server unreachable");
    return false;
  }
  if (res.status === 401) {
    askForToken(token ? "The server refused this token." : "Authentication needed: this server asks for an access token.");
    return false;
  }
  if (!res.ok) {
    showError(`The server answered ${res.status} for the model description: ${await errorText(res)}`);
    return false;
  }
  const body = await res.json();
  model = body.model;
  renderModel(body.model, body.defaults);
  return true;
}

async function errorText(res) {
  try {
    const j = await res.json();
    return j.error || JSON.stringify(j);
  } catch {
    return res.statusText;
  }
}

function askForToken(message) {
  showError(message);
  setStatus("Authentication needed");
  ui.tokenForm.hidden = false;
  ui.connect.disabled = true;
  ui.token.focus();
}

ui.tokenForm.addEventListener("submit", async (e) => {
  e.preventDefault();
  token = ui.token.value.trim();
  sessionStorage.setItem("moshid-token", token);
  clearError();
  if (await loadModel()) {
    ui.tokenForm.hidden = true;
    setStatus("Ready");
    ready();
    if (query.get("start") === "1") start();
  }
});

function renderModel(m, defaults) {
  ui.model.textContent = m.name;
  const badge = (text) => {
    const b = document.createElement("span");
    b.className = "badge";
    b.textContent = text;
    ui.model.append(" ", b);
  };
  badge(m.type);
  if (m.demo) badge("random weights: no speech");
  if (m.random_weights) badge(`random weights (${m.random_weights}): no speech, for measuring`);
  badge(m.backend.split(" ")[0]);
  const f = ui.params.elements;
  for (const k of ["text_temperature", "text_topk", "audio_temperature", "audio_topk", "cfg_coef",
                   "pad_mult", "repetition_penalty", "repetition_penalty_context"]) {
    if (defaults[k] !== undefined) f[k].value = defaults[k];
  }
  ui.conditioners.replaceChildren();
  for (const c of m.conditioners) {
    const label = document.createElement("label");
    label.textContent = c.name + " ";
    const select = document.createElement("select");
    select.name = "condition." + c.name;
    select.append(new Option("(none)", ""));
    for (const v of c.values) select.append(new Option(v, v));
    label.append(select);
    ui.conditioners.append(label);
  }
  ui.cfgRow.hidden = m.conditioners.length === 0;
}

function sessionQuery() {
  const q = new URLSearchParams();
  const f = ui.params.elements;
  for (const k of ["text_temperature", "text_topk", "audio_temperature", "audio_topk",
                   "pad_mult", "repetition_penalty", "repetition_penalty_context"]) {
    if (f[k].value !== "") q.set(k, f[k].value);
  }
  if (f.seed.value !== "") q.set("seed", f.seed.value);
  if (f.greedy.checked) q.set("greedy", "true");
  if (model && model.conditioners.length) {
    if (f.cfg_coef.value !== "") q.set("cfg_coef", f.cfg_coef.value);
    for (const s of ui.conditioners.querySelectorAll("select")) {
      if (s.value) q.set(s.name, s.value);
    }
  }
  // Browsers cannot set headers on a WebSocket: the token goes as Kyutai's
  // server takes it from browsers.
  if (token) q.set("auth_id", token);
  return q.toString();
}

// ---- one conversation ----

class Session {
  constructor() {
    this.state = "starting";
    this.handshake = false;
    this.opened = false;
    this.userEnded = false;
    this.serverErrors = [];
    this.record = null;
    this.texts = [];
    this.sentFrames = 0;
    this.sentUs = 0;
    this.answered = 0;
    this.frameDoneAt = new Float64Array(512);
    this.latencies = [];
    this.decodedMs = 0;
    this.blockedMs = 0;
    this.player = { playedMs: 0, bufferedMs: 0, targetMs: 0, underruns: 0, droppedMs: 0 };
    this.capturePath = null;
    this.writer = new OggOpusWriter();
    this.reader = new OggReader();
    this.headersSent = false;
    this.decoder = null;
    this.decodeUs = 0;
    this.packetIndex = 0;
    this.micLevel = 0;
  }

  async start() {
    const mic = await openMicrophone();
    if (!mic) return this.fail();
    this.stream = mic;
    try {
      this.ctx = new AudioContext({ sampleRate: SAMPLE_RATE, latencyHint: "interactive" });
      await this.ctx.audioWorklet.addModule("/assets/worklets.js");
      this.playerNode = new AudioWorkletNode(this.ctx, "moshid-player", {
        numberOfInputs: 0, outputChannelCount: [1], processorOptions: { targetMs: 120 },
      });
      this.playerNode.port.onmessage = (e) => { this.player = e.data; };
      this.playerNode.connect(this.ctx.destination);
    } catch (e) {
      showError("The browser could not start audio playback: " + e.message);
      return this.fail();
    }
    this.watchPlayback();
    this.connect();
  }

  // Autoplay rules: without a click on this page the context stays
  // suspended. Ask for the click; the session goes on meanwhile.
  watchPlayback() {
    const check = () => {
      const blocked = this.ctx.state !== "running" && this.state !== "ended";
      ui.audioBlocked.hidden = !blocked;
    };
    this.ctx.onstatechange = check;
    this.ctx.resume().catch(() => {});
    setTimeout(check, 300);
  }

  connect() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const url = `${scheme}//${location.host}/api/chat?${sessionQuery()}`;
    setStatus("Connecting…");
    const ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    ws.onopen = () => {
      this.opened = true;
      setStatus("Waiting for a free slot…");
    };
    ws.onmessage = (e) => this.onMessage(new Uint8Array(e.data));
    ws.onclose = (e) => this.onClose(e);
  }

  onMessage(data) {
    if (data.length === 0) return;
    const body = data.subarray(1);
    switch (data[0]) {
      case KIND.HANDSHAKE:
        if (!this.handshake) this.onHandshake();
        break;
      case KIND.AUDIO:
        this.onAudio(body);
        break;
      case KIND.TEXT: {
        const text = new TextDecoder().decode(body);
        this.texts.push(text);
        ui.transcript.textContent += text;
        ui.transcript.scrollTop = ui.transcript.scrollHeight;
        break;
      }
      case KIND.METADATA:
        try {
          this.record = JSON.parse(new TextDecoder().decode(body));
        } catch {
          this.record = { unreadable: new TextDecoder().decode(body) };
        }
        showRecord(this.record);
        break;
      case KIND.ERROR:
        this.serverErrors.push(new TextDecoder().decode(body));
        break;
      default:
        break; // 0x06 ping and kinds this page does not know
    }
  }

  onHandshake() {
    this.handshake = true;
    this.state = "live";
    setStatus("Connected: speak", true);
    ui.hangup.disabled = false;
    try {
      this.startCapture();
    } catch (e) {
      showError("The microphone could not be encoded: " + e.message);
      this.hangup();
    }
  }

  // ---- sending ----

  startCapture() {
    const track = this.stream.getAudioTracks()[0];
    const forceWorklet = query.get("capture") === "worklet";
    if (!forceWorklet && typeof MediaStreamTrackProcessor === "function") {
      this.capturePath = "track-processor";
      const reader = new MediaStreamTrackProcessor({ track }).readable.getReader();
      this.trackReader = reader;
      const pump = async () => {
        for (;;) {
          const { value, done } = await reader.read();
          if (done || this.state !== "live") {
            if (value) value.close();
            return;
          }
          const samples = new Float32Array(value.numberOfFrames);
          value.copyTo(samples, { planeIndex: 0, format: "f32-planar" });
          const rate = value.sampleRate;
          value.close();
          this.encode(samples, rate);
        }
      };
      pump().catch((e) => this.captureFailed(e));
    } else {
      this.capturePath = "worklet";
      const source = this.ctx.createMediaStreamSource(this.stream);
      const node = new AudioWorkletNode(this.ctx, "moshid-capture", { numberOfOutputs: 0 });
      node.port.onmessage = (e) => {
        if (this.state === "live") this.encode(e.data, this.ctx.sampleRate);
      };
      source.connect(node);
      this.captureNode = node;
    }
  }

  captureFailed(e) {
    if (this.state !== "live") return;
    showError("The microphone stopped: " + e.message);
    this.hangup();
  }

  encode(samples, rate) {
    let sum = 0;
    for (let i = 0; i < samples.length; i++) sum += samples[i] * samples[i];
    this.micLevel = Math.min(1, Math.sqrt(sum / samples.length) * 4);
    if (!this.encoder) {
      this.encoderRate = rate;
      this.encoder = new AudioEncoder({
        output: (chunk, meta) => this.onEncoded(chunk, meta),
        error: (e) => this.captureFailed(e),
      });
      this.encoder.configure({ ...OPUS, sampleRate: rate });
      this.inputUs = 0;
    }
    const data = new AudioData({
      format: "f32-planar", sampleRate: rate, numberOfFrames: samples.length, numberOfChannels: 1,
      timestamp: this.inputUs, data: samples,
    });
    this.inputUs += (samples.length * 1e6) / rate;
    this.encoder.encode(data);
    data.close();
  }

  onEncoded(chunk, meta) {
    if (this.state !== "live" || this.ws.readyState !== WebSocket.OPEN) return;
    if (!this.headersSent) {
      const desc = meta && meta.decoderConfig && meta.decoderConfig.description;
      let head = desc ? new Uint8Array(desc.buffer ? desc.buffer.slice(desc.byteOffset, desc.byteOffset + desc.byteLength) : desc) : null;
      if (!head || head.length < 19) head = opusHead({ inputRate: this.encoderRate });
      this.send(this.writer.headers(head, "moshid page (WebCodecs)"));
      this.headersSent = true;
    }
    const packet = new Uint8Array(chunk.byteLength);
    chunk.copyTo(packet);
    const samples48k = opusPacketSamples48k(packet) || Math.round((chunk.duration || 20000) * 0.048);
    this.send(this.writer.audio(packet, samples48k));
    // Input frame j is complete on the server once 80 ms × (j + 1) of audio
    // has been sent: remember when, to time its answer.
    this.sentUs += (samples48k * 1e6) / 48000;
    while (this.sentUs >= (this.sentFrames + 1) * FRAME_US) {
      this.frameDoneAt[this.sentFrames % this.frameDoneAt.length] = performance.now();
      this.sentFrames++;
    }
    if (this.ws.bufferedAmount > MAX_BUFFERED_BYTES) {
      showError("Connection lost: the network does not carry the audio fast enough.");
      this.ws.close(4000, "client link too slow");
    }
  }

  send(page) {
    const msg = new Uint8Array(1 + page.length);
    msg[0] = KIND.AUDIO;
    msg.set(page, 1);
    this.ws.send(msg);
  }

  // ---- receiving ----

  onAudio(bytes) {
    let packets;
    try {
      packets = this.reader.push(bytes);
    } catch (e) {
      showError("The server's audio could not be read: " + e.message);
      this.ws.close(4001, "bad audio from the server");
      return;
    }
    let audioPackets = 0;
    for (const p of packets) {
      const index = this.packetIndex++;
      if (index === 0) this.configureDecoder(p.data);
      else if (index === 1) continue; // OpusTags
      else {
        audioPackets++;
        this.decode(p.data);
      }
    }
    if (audioPackets > 0) {
      // The server answers each input frame with one audio message; answer k
      // is its step on frame k + frames_before_output.
      const j = this.answered + (model ? model.frames_before_output : 1);
      this.answered++;
      if (j < this.sentFrames && this.sentFrames - j < this.frameDoneAt.length) {
        this.latencies.push(performance.now() - this.frameDoneAt[j % this.frameDoneAt.length]);
        if (this.latencies.length > 200) this.latencies.shift();
      }
    }
  }

  configureDecoder(headBytes) {
    let head;
    try {
      head = parseOpusHead(headBytes);
    } catch (e) {
      showError("The server's audio could not be read: " + e.message);
      return;
    }
    this.decoder = new AudioDecoder({
      output: (audio) => this.onDecoded(audio),
      error: (e) => showError("The server's audio could not be decoded: " + e.message),
    });
    this.decoder.configure({
      codec: "opus", sampleRate: head.inputRate || 48000, numberOfChannels: head.channels, description: headBytes,
    });
  }

  decode(packet) {
    if (!this.decoder || this.decoder.state !== "configured") return;
    const samples48k = opusPacketSamples48k(packet) || 960;
    const duration = (samples48k * 1e6) / 48000;
    this.decoder.decode(new EncodedAudioChunk({ type: "key", timestamp: this.decodeUs, duration, data: packet }));
    this.decodeUs += duration;
  }

  onDecoded(audio) {
    let samples = new Float32Array(audio.numberOfFrames);
    audio.copyTo(samples, { planeIndex: 0, format: "f32-planar" });
    const rate = audio.sampleRate;
    audio.close();
    this.decodedMs += (samples.length * 1000) / rate;
    if (rate !== this.ctx.sampleRate) samples = resample(samples, rate, this.ctx.sampleRate);
    if (this.ctx.state === "running") {
      this.playerNode.port.postMessage(samples, [samples.buffer]);
    } else {
      this.blockedMs += (samples.length * 1000) / this.ctx.sampleRate;
    }
  }

  // ---- the end ----

  hangup() {
    if (this.state === "live") {
      // End of input: the server answers what is in flight, sends the
      // record and closes.
      this.state = "ending";
      this.userEnded = true;
      this.stopCapture();
      if (this.ws.readyState === WebSocket.OPEN) this.ws.send(END_OF_INPUT);
      setStatus("Finishing: the server answers what is in flight…");
      ui.hangup.disabled = true;
      this.endTimer = setTimeout(() => this.ws.close(1000, "hang up"), END_TIMEOUT_MS);
    } else if (this.state === "starting" && this.ws) {
      this.userEnded = true;
      this.ws.close(1000, "hang up");
    }
  }

  stopCapture() {
    if (this.trackReader) this.trackReader.cancel().catch(() => {});
    if (this.captureNode) this.captureNode.disconnect();
    if (this.stream) for (const t of this.stream.getTracks()) t.stop();
    if (this.encoder && this.encoder.state !== "closed") this.encoder.close();
  }

  async onClose(e) {
    clearTimeout(this.endTimer);
    const wasLive = this.handshake;
    this.state = "ended";
    this.stopCapture();
    ui.hangup.disabled = true;
    ui.audioBlocked.hidden = true;
    const said = this.serverErrors.join("\n");
    if (!wasLive) {
      if (said && /^server full/i.test(said)) showError("The server is full: " + said);
      else if (said) showError("The server refused the session: " + said);
      else if (!this.userEnded) await this.explainRefusedConnection(e);
    } else if (said) {
      showError("The server ended the session: " + said);
    } else if (!this.record && !this.userEnded) {
      showError(`Connection lost (WebSocket closed with code ${e.code}${e.reason ? ": " + e.reason : ""}).`);
    }
    setStatus(this.record ? "Session ended" : wasLive ? "Disconnected" : "Not connected");
    render();
    // Let what is buffered play out, then free the audio device.
    setTimeout(() => this.ctx && this.ctx.close().catch(() => {}), 1500);
    session = null;
    ready();
  }

  // A WebSocket refused at the upgrade shows no status to the page: ask the
  // server the same question over fetch to say why.
  async explainRefusedConnection(e) {
    try {
      const res = await fetch("/v1/model", { headers: authHeaders(), cache: "no-store" });
      if (res.status === 401) {
        askForToken(token ? "Authentication needed: the server refused this token." : "Authentication needed: this server asks for an access token.");
        return;
      }
    } catch {
      showError("Connection lost: the server cannot be reached.");
      return;
    }
    showError(`The server closed the connection before the session started (code ${e.code}).`);
  }

  fail() {
    this.state = "ended";
    session = null;
    setStatus("Not connected");
    ready();
  }

  snapshot() {
    const sorted = [...this.latencies].sort((a, b) => a - b);
    return {
      state: this.state,
      handshake: this.handshake,
      capturePath: this.capturePath,
      audioContext: this.ctx ? this.ctx.state : null,
      sentFrames: this.sentFrames,
      answeredFrames: this.answered,
      decodedMs: Math.round(this.decodedMs),
      playedMs: this.player.playedMs,
      bufferedMs: this.player.bufferedMs,
      targetMs: this.player.targetMs,
      underruns: this.player.underruns,
      droppedMs: this.player.droppedMs,
      blockedMs: Math.round(this.blockedMs),
      latencyMs: sorted.length ? Math.round(sorted[Math.floor(sorted.length / 2)]) : null,
      lastLatencyMs: this.latencies.length ? Math.round(this.latencies[this.latencies.length - 1]) : null,
      transcript: this.texts.join(""),
      serverErrors: this.serverErrors,
      record: this.record,
    };
  }
}

async function openMicrophone() {
  if (!window.isSecureContext || !navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    showError("The microphone needs a secure page: open this page over https:// (or from localhost).");
    return null;
  }
  setStatus("Asking for the microphone…");
  try {
    return await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true, channelCount: 1 },
    });
  } catch (e) {
    const why = {
      NotAllowedError: "Microphone access was denied. Allow it for this site in the browser's settings, then connect again.",
      SecurityError: "Microphone access was denied by the browser's security settings.",
      NotFoundError: "No microphone was found. Plug one in, then connect again.",
      OverconstrainedError: "No microphone was found that can do echo cancellation.",
      NotReadableError: "The microphone cannot be read: another program may be using it.",
      AbortError: "The microphone could not be started.",
    }[e.name];
    showError(why || `The microphone could not be opened: ${e.name}: ${e.message}`);
    return null;
  }
}

function resample(input, from, to) {
  const n = Math.round((input.length * to) / from);
  const out = new Float32Array(n);
  const step = from / to;
  for (let i = 0; i < n; i++) {
    const x = i * step;
    const k = Math.floor(x);
    const f = x - k;
    const a = input[Math.min(k, input.length - 1)];
    const b = input[Math.min(k + 1, input.length - 1)];
    out[i] = a + (b - a) * f;
  }
  return out;
}

function showRecord(record) {
  const s = record.session || record;
  const rows = [];
  const add = (k, v) => rows.push([k, v]);
  if (s.end_reason) add("ended", s.end_reason.detail ? `${s.end_reason.kind}: ${s.end_reason.detail}` : s.end_reason.kind);
  for (const [k, v] of Object.entries(s)) {
    if (k === "end_reason") continue;
    add(k.replace(/_/g, " "), v === null ? "–" : typeof v === "object" ? JSON.stringify(v) : String(v));
  }
  ui.record.replaceChildren(
    ...rows.map(([k, v]) => {
      const tr = document.createElement("tr");
      const a = document.createElement("td");
      const b = document.createElement("td");
      a.textContent = k;
      b.textContent = v;
      tr.append(a, b);
      return tr;
    }),
  );
  ui.recordBox.hidden = false;
}

// ---- wiring ----

function ready() {
  ui.connect.disabled = !model || session !== null;
}

async function start() {
  if (session || !model) return;
  clearError();
  ui.transcript.textContent = "";
  ui.recordBox.hidden = true;
  ui.connect.disabled = true;
  session = new Session();
  window.moshid.last = session;
  await session.start();
}

ui.connect.addEventListener("click", start);
ui.hangup.addEventListener("click", () => session && session.hangup());
ui.allowAudio.addEventListener("click", () => session && session.ctx && session.ctx.resume());
// Any click on the page counts as the user's permission to play sound.
document.addEventListener("pointerdown", () => {
  if (session && session.ctx && session.ctx.state === "suspended") session.ctx.resume();
});

// The meters, four times a second and once more when a session ends.
function render() {
  const s = session || window.moshid.last;
  if (!s) return;
  const snap = s.snapshot();
  ui.mic.value = s.state === "live" ? s.micLevel : 0;
  ui.latency.textContent = snap.latencyMs === null ? "–" : `${snap.latencyMs} ms (last ${snap.lastLatencyMs} ms)`;
  ui.buffer.textContent = s.ctx ? `${snap.bufferedMs} ms (target ${snap.targetMs} ms, ${snap.underruns} underruns)` : "–";
  ui.frames.textContent = `${snap.sentFrames} / ${snap.answeredFrames} frames`;
  ui.played.textContent = `${(snap.playedMs / 1000).toFixed(1)} s` + (snap.blockedMs ? ` (${(snap.blockedMs / 1000).toFixed(1)} s muted by the browser)` : "");
}
setInterval(render, 250);

window.moshid = {
  last: null,
  errors,
  snapshot() {
    const s = session || this.last;
    return {
      model,
      errors: [...errors],
      status: ui.status.textContent,
      tokenAsked: !ui.tokenForm.hidden,
      audioBlockedShown: !ui.audioBlocked.hidden,
      connectEnabled: !ui.connect.disabled,
      session: s ? s.snapshot() : null,
    };
  },
};

async function main() {
  if (typeof AudioEncoder !== "function" || typeof AudioDecoder !== "function") {
    showError("This browser cannot encode Opus: it lacks WebCodecs (AudioEncoder/AudioDecoder). Use a current Chrome, Edge, Firefox or Safari.");
    setStatus("Unsupported browser");
    return;
  }
  const [enc, dec] = await Promise.all([
    AudioEncoder.isConfigSupported({ ...OPUS, sampleRate: 48000 }).catch(() => ({ supported: false })),
    AudioDecoder.isConfigSupported({ codec: "opus", sampleRate: SAMPLE_RATE, numberOfChannels: 1 }).catch(() => ({ supported: false })),
  ]);
  if (!enc.supported || !dec.supported) {
    showError("This browser's WebCodecs cannot " + (enc.supported ? "decode" : "encode") + " Opus.");
    setStatus("Unsupported browser");
    return;
  }
  if (!(await loadModel())) return;
  setStatus("Ready");
  ready();
  if (query.get("start") === "1") start();
}

main();
