// Live captions: the browser's microphone through an AudioWorklet (16 kHz 16-bit PCM) over the
// realtime WebSocket; the stable text and the dimmed tail the next step may still rewrite are shown as
// they come. Stopped, the session is finished on the server and, when asked, saved to the library
// with its audio.

import { liveSocket } from "./api.js";

const FINISH_TIMEOUT_MS = 120_000; // the server's last steps, after the microphone stops

export class Live {
  /** els: {start, stop, language, save, state, stable, unstable}; onSaved(transcriptId). */
  constructor(els, onSaved, status) {
    this.els = els;
    this.onSaved = onSaved;
    this.status = status;
    this.running = false;
    els.start.addEventListener("click", () => this.start());
    els.stop.addEventListener("click", () => this.stop());
  }

  say(text) {
    this.els.state.textContent = text;
  }

  show(stable, unstable) {
    this.els.stable.textContent = stable;
    this.els.unstable.textContent = unstable;
  }

  async start() {
    if (this.running) return;
    this.running = true;
    this.stopping = false;
    this.saved = null;
    this.ws = null;
    this.node = null;
    this.els.start.disabled = true;
    this.els.stop.disabled = false;
    this.show("", "");
    this.say("asking for the microphone…");
    try {
      this.stream = await navigator.mediaDevices.getUserMedia({
        audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
      });
    } catch (e) {
      this.fail(`no microphone: ${e.message || e.name}`);
      return;
    }
    try {
      this.context = new AudioContext({ sampleRate: 16000 });
    } catch {
      this.context = new AudioContext(); // resampled in the worklet instead
    }
    try {
      await this.context.audioWorklet.addModule("/static/pcm-worklet.js");
    } catch (e) {
      this.fail(`the audio worklet could not start: ${e.message}`);
      return;
    }
    this.node = new AudioWorkletNode(this.context, "pcm16");
    this.source = this.context.createMediaStreamSource(this.stream);
    this.source.connect(this.node);
    this.ready = false;
    this.ws = liveSocket();
    this.finished = new Promise((resolve) => {
      this.ws.addEventListener("close", (e) => {
        resolve();
        if (this.running && !this.stopping) this.fail(e.code === 1000 ? "the session ended" : `the connection closed (${e.code})`);
      });
    });
    this.ws.addEventListener("message", (e) => this.event(JSON.parse(e.data)));
    this.ws.addEventListener("open", () => {
      const session = { language: this.els.language.value || null, save: this.els.save.checked };
      this.ws.send(JSON.stringify({ type: "transcription_session.update", session }));
    });
    this.node.port.onmessage = (e) => {
      if (e.data === "flushed") this.flushed?.();
      else if (this.ready && this.ws.readyState === WebSocket.OPEN) this.ws.send(e.data);
    };
    this.say("connecting…");
  }

  event(e) {
    switch (e.type) {
      case "transcription_session.updated":
        this.ready = true;
        this.say("listening: speak");
        break;
      case "conversation.item.input_audio_transcription.delta":
        this.show(e.stable, e.unstable);
        break;
      case "transcription_session.saved":
        this.saved = e.transcript_id;
        break;
      case "transcription_session.finished":
        this.show(e.text, "");
        break;
      case "error":
        this.status(`live captions: ${e.error.message}`, true);
        this.say(e.error.message);
        break;
      default:
        break;
    }
  }

  async stop() {
    if (!this.running || this.stopping) return;
    this.stopping = true;
    this.els.stop.disabled = true;
    this.say("finishing…");
    // The worklet's last samples go out before the end of the audio is announced.
    await new Promise((resolve) => {
      this.flushed = resolve;
      if (this.node) this.node.port.postMessage("flush");
      else resolve();
      setTimeout(resolve, 500);
    });
    this.release();
    if (!this.ws) {
      this.fail("stopped");
      return;
    }
    if (this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify({ type: "session.finish" }));
    const timeout = new Promise((resolve) => setTimeout(resolve, FINISH_TIMEOUT_MS));
    await Promise.race([this.finished, timeout]);
    this.running = false;
    if (this.ws.readyState !== WebSocket.CLOSED) this.ws.close();
    this.els.start.disabled = false;
    if (this.saved) {
      this.say("saved to the library");
      const id = this.saved;
      this.saved = null;
      this.onSaved(id);
    } else {
      this.say("stopped");
    }
  }

  release() {
    this.source?.disconnect();
    this.node?.disconnect();
    for (const track of this.stream?.getTracks() || []) track.stop();
    this.context?.close().catch(() => {});
  }

  fail(line) {
    this.running = false;
    this.release();
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.close();
    this.els.start.disabled = false;
    this.els.stop.disabled = true;
    this.say(line);
    this.status(`live captions: ${line}`, true);
  }
}
