// The microphone, converted on the audio thread to mono pcm16 at the session's input rate and
// posted to the page in fixed chunks (ArrayBuffers, transferred).
//
// The context runs at the device's rate (Firefox cannot feed a microphone into a context of
// another rate), so this resamples. Down: each output sample is the mean of the input it spans
// (a box filter: speech keeps little above the 8 kHz the model hears, which the bridge's soxr
// cuts anyway, so its weak stop band costs nothing audible). Up: linear interpolation.
//
// Port messages in: {active: bool} starts/stops capture (stopping posts what is buffered, then
// {type: "flushed"}); {rate: n} changes the output rate. Out: {type: "chunk", pcm} and
// {type: "flushed"}.

class MicPcm16 extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const o = options.processorOptions || {};
    this.chunkMs = o.chunkMs || 40;
    this.active = false;
    this.setRate(o.targetRate || 24000);
    this.port.onmessage = (e) => {
      const m = e.data;
      if (typeof m.rate === 'number' && m.rate > 0 && m.rate !== this.outRate) {
        this.flush();
        this.setRate(m.rate);
      }
      if (m.active === true && !this.active) {
        this.reset();
        this.active = true;
      } else if (m.active === false && this.active) {
        this.active = false;
        this.flush();
        this.port.postMessage({ type: 'flushed' });
      }
    };
  }

  setRate(rate) {
    this.outRate = rate;
    this.step = sampleRate / rate;             // input samples per output sample
    this.chunk = new Int16Array(Math.max(1, Math.round(rate * this.chunkMs / 1000)));
    this.reset();
  }

  reset() {
    this.fill = 0;
    this.acc = 0;        // down: weighted sum of the current output sample's inputs
    this.have = 0;       // down: input samples (fractional) summed into acc
    this.prev = 0;       // up: the last input sample
    this.t = 0;          // up: the next output's position after prev, in input samples
  }

  emit(x) {
    const v = x > 1 ? 1 : x < -1 ? -1 : x;
    this.chunk[this.fill++] = Math.round(v < 0 ? v * 0x8000 : v * 0x7fff);
    if (this.fill === this.chunk.length) this.flush();
  }

  flush() {
    if (this.fill === 0) return;
    // Little-endian whatever the host: pcm16 on the wire is s16le.
    const out = new DataView(new ArrayBuffer(this.fill * 2));
    for (let i = 0; i < this.fill; i++) out.setInt16(2 * i, this.chunk[i], true);
    this.fill = 0;
    this.port.postMessage({ type: 'chunk', pcm: out.buffer }, [out.buffer]);
  }

  process(inputs) {
    const channels = inputs[0];
    if (!this.active || !channels || channels.length === 0) return true;
    const n = channels[0].length;
    const step = this.step;
    for (let i = 0; i < n; i++) {
      let x = 0;
      for (let c = 0; c < channels.length; c++) x += channels[c][i];
      x /= channels.length;
      if (step >= 1) {
        let left = 1;                          // the part of this input sample not yet used
        while (left > 0) {
          const need = step - this.have;
          if (left < need) {
            this.acc += x * left;
            this.have += left;
            left = 0;
          } else {
            this.acc += x * need;
            this.emit(this.acc / step);
            this.acc = 0;
            this.have = 0;
            left -= need;
          }
        }
      } else {
        while (this.t <= 1) {
          this.emit(this.prev + (x - this.prev) * this.t);
          this.t += step;
        }
        this.t -= 1;
        this.prev = x;
      }
    }
    return true;
  }
}

registerProcessor('mic-pcm16', MicPcm16);
