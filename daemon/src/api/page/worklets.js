// AudioWorklet processors of the page (they run on the audio thread).
//
// moshid-player: the model's audio, through a small jitter buffer. Playback
// starts once `targetMs` are buffered; an underrun plays silence, raises the
// target by one step (up to `maxTargetMs`) and buffers again; more than
// `targetMs + slackMs` buffered (a sender clock faster than this device's)
// drops the oldest samples, so the delay never grows without bound. Every
// 100 ms it reports what it played to the page.
//
// moshid-capture: the microphone as 20 ms blocks of samples, for browsers
// without MediaStreamTrackProcessor (the page prefers that one: it does not
// need a running AudioContext).

class Player extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const o = options.processorOptions || {};
    this.targetMs = o.targetMs || 120;
    this.stepMs = o.stepMs || 40;
    this.maxTargetMs = o.maxTargetMs || 400;
    this.slackMs = o.slackMs || 320;
    this.ring = new Float32Array(Math.ceil(sampleRate * 2));
    this.read = 0;
    this.size = 0;
    this.playing = false;
    this.played = 0;
    this.underruns = 0;
    this.dropped = 0;
    this.lastReport = 0;
    this.port.onmessage = (e) => {
      if (e.data === "flush") {
        this.size = 0;
        this.playing = false;
        return;
      }
      this.push(e.data);
    };
  }

  ms(n) {
    return Math.round((n * 1000) / sampleRate);
  }

  push(samples) {
    const cap = this.ring.length;
    const max = Math.floor(((this.targetMs + this.slackMs) * sampleRate) / 1000);
    for (let i = 0; i < samples.length; i++) {
      if (this.size === cap) {
        this.read = (this.read + 1) % cap;
        this.size--;
        this.dropped++;
      }
      this.ring[(this.read + this.size) % cap] = samples[i];
      this.size++;
    }
    if (this.size > max) {
      const drop = this.size - Math.floor((this.targetMs * sampleRate) / 1000);
      this.read = (this.read + drop) % cap;
      this.size -= drop;
      this.dropped += drop;
    }
  }

  process(_inputs, outputs) {
    const out = outputs[0][0];
    const cap = this.ring.length;
    if (!this.playing && this.size >= (this.targetMs * sampleRate) / 1000) this.playing = true;
    let n = 0;
    if (this.playing) {
      n = Math.min(out.length, this.size);
      for (let i = 0; i < n; i++) out[i] = this.ring[(this.read + i) % cap];
      this.read = (this.read + n) % cap;
      this.size -= n;
      this.played += n;
      if (n < out.length) {
        this.playing = false;
        this.underruns++;
        this.targetMs = Math.min(this.maxTargetMs, this.targetMs + this.stepMs);
      }
    }
    for (let i = n; i < out.length; i++) out[i] = 0;
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(out);
    if (currentTime - this.lastReport >= 0.1) {
      this.lastReport = currentTime;
      this.port.postMessage({
        playedMs: this.ms(this.played),
        bufferedMs: this.ms(this.size),
        targetMs: this.targetMs,
        underruns: this.underruns,
        droppedMs: this.ms(this.dropped),
      });
    }
    return true;
  }
}

class Capture extends AudioWorkletProcessor {
  constructor() {
    super();
    this.block = new Float32Array(Math.round(sampleRate / 50));
    this.filled = 0;
  }

  process(inputs) {
    const input = inputs[0] && inputs[0][0];
    if (!input) return true;
    let at = 0;
    while (at < input.length) {
      const n = Math.min(input.length - at, this.block.length - this.filled);
      this.block.set(input.subarray(at, at + n), this.filled);
      this.filled += n;
      at += n;
      if (this.filled === this.block.length) {
        const size = this.block.length;
        // Transferred: the block is the page's now, and a new one is made.
        this.port.postMessage(this.block, [this.block.buffer]);
        this.block = new Float32Array(size);
        this.filled = 0;
      }
    }
    return true;
  }
}

registerProcessor("moshid-player", Player);
registerProcessor("moshid-capture", Capture);
