// The live microphone as 16 kHz 16-bit PCM: an AudioWorklet that takes the first channel, resamples
// it (linear interpolation) when the context does not run at 16 kHz, and posts 100 ms blocks of
// little-endian Int16 samples to the page, which sends them over the realtime WebSocket.

const RATE = 16000;
const BLOCK = RATE / 10;

class Pcm16 extends AudioWorkletProcessor {
  constructor() {
    super();
    this.step = sampleRate / RATE; // input samples per output sample
    this.at = 0; // the next output sample's position in the current input block (may be -1..0)
    this.last = 0; // the previous block's last sample
    this.out = new Int16Array(BLOCK);
    this.n = 0;
    this.port.onmessage = (e) => {
      if (e.data === "flush") {
        this.post();
        this.port.postMessage("flushed");
      }
    };
  }

  push(x) {
    const v = Math.max(-1, Math.min(1, x));
    this.out[this.n++] = v < 0 ? v * 32768 : v * 32767;
    if (this.n === BLOCK) this.post();
  }

  post() {
    if (!this.n) return;
    const block = this.out.slice(0, this.n);
    this.port.postMessage(block.buffer, [block.buffer]);
    this.n = 0;
  }

  process(inputs) {
    const input = inputs[0] && inputs[0][0];
    if (!input) return true;
    if (this.step === 1) {
      for (let i = 0; i < input.length; i++) this.push(input[i]);
      return true;
    }
    let t = this.at;
    while (t < input.length - 1) {
      const i = Math.floor(t);
      const a = i < 0 ? this.last : input[i];
      const b = input[i + 1];
      this.push(a + (b - a) * (t - i));
      t += this.step;
    }
    this.at = t - input.length;
    this.last = input[input.length - 1];
    return true;
  }
}

registerProcessor("pcm16", Pcm16);
