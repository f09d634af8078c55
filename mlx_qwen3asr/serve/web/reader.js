// One transcript, read along with its audio: the word (or the segment, where words are not timed)
// being spoken is highlighted on every animation frame (a binary search over start times); a click on
// a word plays from it; the view follows the audio until the person scrolls or edits. Segments are
// corrected in place and saved at once as a new revision of the library; undo and redo restore
// revisions; edited segments can be re-timed by the aligner; speakers are renamed, reassigned and
// heard.

import { audioURL, download, json, send } from "./api.js";
import { renderSpeakers, speakerChoice, speakerLabels } from "./speakers.js";
import {
  activeIndex,
  formatTime,
  isLowConfidence,
  keepWordTimes,
  speakerColour,
  speakerSample,
  wordRanges,
} from "./timing.js";

const STEP_SECONDS = 5;
const SPEEDS = [0.5, 0.75, 1, 1.25, 1.5, 1.75, 2];
const OWN_SCROLL_MS = 900; // scroll events this soon after the view moved itself are its own

export class Reader {
  constructor(els, { status, changed, deleted }) {
    this.els = els;
    this.status = status;
    this.changed = changed; // the list should show a new title or a new transcript
    this.deleted = deleted;
    this.doc = null;
    this.items = { starts: [], ends: [], nodes: [] };
    this.now = null;
    this.following = true;
    this.autoScrolled = 0;
    this.editing = null;
    this.undo = [];
    this.redo = [];
    this.edited = new Set();
    this.stopAt = null;
    this.saving = Promise.resolve();
    this.revokeAudio = () => {};
    this.wire();
  }

  // -- opening --

  async open(id, at = null) {
    const doc = await json(`/v1/transcripts/${id}`);
    this.revokeAudio();
    this.doc = doc;
    this.undo = Array.from({ length: Math.max(0, doc.revision - 1) }, (_, k) => k + 1);
    this.redo = [];
    this.edited = new Set();
    this.editing = null;
    this.now = null;
    this.following = true;
    this.els.follow.hidden = true;
    this.render();
    const audio = this.els.audio;
    if (doc.audio) {
      const { url, revoke } = await audioURL(id);
      this.revokeAudio = revoke;
      audio.src = url;
      audio.hidden = false;
    } else {
      audio.removeAttribute("src");
      audio.hidden = true;
    }
    audio.playbackRate = Number(this.els.speed.value);
    if (at !== null) this.seek(at, false);
    else this.highlight(0);
  }

  close() {
    this.els.audio.pause();
    this.revokeAudio();
    this.revokeAudio = () => {};
    this.doc = null;
  }

  // -- drawing --

  render() {
    const doc = this.doc;
    this.els.title.textContent = doc.title;
    document.title = `${doc.title} · mlx-qwen3asr`;
    const bits = [
      new Date(doc.created * 1000).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" }),
      formatTime(doc.duration),
      doc.language,
      `revision ${doc.revision}`,
    ];
    this.els.meta.textContent = bits.filter(Boolean).join(" · ");
    this.renderSpeakers();
    this.renderSegments();
    this.buttons();
  }

  speakers() {
    return speakerLabels(this.doc);
  }

  renderSpeakers() {
    renderSpeakers(this);
  }

  renderSegments() {
    const doc = this.doc;
    const speakers = this.speakers();
    const starts = [];
    const ends = [];
    const nodes = [];
    const rows = doc.segments.map((seg, n) => {
      const li = document.createElement("li");
      li.dataset.id = seg.id;
      const k = speakers.indexOf(seg.speaker);
      if (seg.speaker) li.style.setProperty("--c", speakerColour(k));
      if (this.edited.has(seg.id)) li.classList.add("edited");
      const side = document.createElement("div");
      side.className = "side";
      const time = document.createElement("button");
      time.type = "button";
      time.className = "time";
      time.textContent = formatTime(seg.start);
      time.setAttribute("aria-label", `Play segment ${n + 1} from ${formatTime(seg.start)}`);
      time.addEventListener("click", () => this.seek(seg.start, true));
      side.append(time);
      if (speakers.length) side.append(speakerChoice(this, seg, n, speakers));
      if (isLowConfidence(seg)) {
        li.classList.add("low");
        const low = document.createElement("span");
        low.className = "low-mark";
        low.textContent = "low confidence";
        low.title = `average log-probability ${Number(seg.avg_logprob).toFixed(2)}`;
        side.append(low);
      }
      const text = document.createElement("div");
      text.className = "text";
      text.tabIndex = 0;
      text.setAttribute("role", "textbox");
      text.setAttribute("aria-readonly", "true"); // Enter (or a double-click) edits it
      text.setAttribute("aria-label", `Text of segment ${n + 1}`);
      text.dataset.n = n;
      const words = (seg.words || []).filter((w) => Number.isFinite(w.start) && Number.isFinite(w.end));
      const ranges = words.length ? wordRanges(seg.text, words) : [];
      if (ranges.length) {
        let cursor = 0;
        for (const r of ranges) {
          if (r.from > cursor) text.append(seg.text.slice(cursor, r.from));
          const span = document.createElement("span");
          span.className = "w";
          span.textContent = seg.text.slice(r.from, r.to);
          span.dataset.t = words[r.k].start;
          starts.push(words[r.k].start);
          ends.push(Math.max(words[r.k].end, words[r.k].start + 0.05));
          nodes.push(span);
          text.append(span);
          cursor = r.to;
        }
        if (cursor < seg.text.length) text.append(seg.text.slice(cursor));
      } else {
        text.textContent = seg.text;
        text.dataset.t = seg.start;
        starts.push(seg.start);
        ends.push(seg.end);
        nodes.push(text);
      }
      li.append(side, text);
      return li;
    });
    // Words are in order within a segment, and segments in time: sorted by start for the search.
    const order = starts.map((_, k) => k).sort((a, b) => starts[a] - starts[b] || a - b);
    this.items = {
      starts: Float64Array.from(order, (k) => starts[k]),
      ends: Float64Array.from(order, (k) => ends[k]),
      nodes: order.map((k) => nodes[k]),
    };
    this.now = null;
    this.els.segments.replaceChildren(...rows);
    if (!rows.length) {
      const li = document.createElement("li");
      li.textContent = "No speech was found in this recording.";
      this.els.segments.append(li);
    }
  }

  buttons() {
    const rttm = this.els.exportFormat.querySelector("option[value=rttm]");
    rttm.disabled = this.speakers().length === 0; // who spoke when: only where speakers were found
    if (rttm.disabled && rttm.selected) this.els.exportFormat.value = "txt";
    this.els.undo.disabled = this.undo.length === 0;
    this.els.redo.disabled = this.redo.length === 0;
    this.els.retime.disabled = this.edited.size === 0 || !this.doc.audio;
  }

  // -- the audio --

  wire() {
    const { audio, segments, follow, speed } = this.els;
    const frame = () => {
      this.highlight(audio.currentTime);
      if (this.stopAt !== null && audio.currentTime >= this.stopAt) {
        audio.pause();
        this.stopAt = null;
      }
      if (!audio.paused) requestAnimationFrame(frame);
    };
    audio.addEventListener("play", () => requestAnimationFrame(frame));
    audio.addEventListener("seeked", () => this.highlight(audio.currentTime));
    audio.addEventListener("pause", () => this.highlight(audio.currentTime));
    audio.addEventListener("ratechange", () => {
      speed.value = String(audio.playbackRate);
    });
    speed.addEventListener("change", () => {
      audio.playbackRate = Number(speed.value);
    });
    segments.addEventListener("click", (e) => {
      const word = e.target.closest(".w, .text");
      if (!word || word.isContentEditable || !word.dataset.t) return;
      if (word.classList.contains("text") && e.target !== word) return;
      this.seek(Number(word.dataset.t), true);
    });
    segments.addEventListener("dblclick", (e) => {
      const text = e.target.closest(".text");
      if (text && !text.isContentEditable) this.edit(text);
    });
    segments.addEventListener("keydown", (e) => {
      const text = e.target.closest?.(".text");
      if (!text) return;
      if (!text.isContentEditable && e.key === "Enter") {
        e.preventDefault();
        this.edit(text);
      } else if (text.isContentEditable && e.key === "Enter" && !e.shiftKey) {
        e.preventDefault();
        text.blur();
      } else if (text.isContentEditable && e.key === "Escape") {
        e.preventDefault();
        this.editing = null;
        this.renderSegments();
        this.highlight(this.els.audio.currentTime);
        segments.querySelector(`[data-n="${text.dataset.n}"]`)?.focus();
      }
    });
    segments.addEventListener("focusout", (e) => {
      const text = e.target.closest?.(".text");
      if (text && text.isContentEditable && this.editing === text) this.commit(text);
    });
    const scroller = this.els.scroller;
    const userScrolled = () => {
      if (Date.now() - this.autoScrolled > OWN_SCROLL_MS && !this.els.audio.paused) this.stopFollowing();
    };
    for (const target of [scroller, window]) {
      target.addEventListener("wheel", userScrolled, { passive: true });
      target.addEventListener("touchmove", userScrolled, { passive: true });
    }
    scroller.addEventListener("scroll", userScrolled, { passive: true });
    follow.addEventListener("click", () => this.resumeFollowing());
  }

  seek(t, play) {
    const audio = this.els.audio;
    this.stopAt = null;
    this.resumeFollowing();
    audio.currentTime = Math.max(0, t);
    this.highlight(t, true);
    if (play && audio.src) audio.play().catch(() => {});
  }

  /** Marks what is spoken at time t; the view scrolls to it while following (or when forced). */
  highlight(t, force = false) {
    const { starts, ends, nodes } = this.items;
    const k = activeIndex(starts, ends, t);
    const node = k >= 0 ? nodes[k] : null;
    if (node === this.now && !force) return;
    if (this.now) {
      this.now.classList.remove("now");
      this.now.closest("li")?.classList.remove("now");
    }
    this.now = node;
    if (!node) return;
    node.classList.add("now");
    node.closest("li")?.classList.add("now");
    if ((this.following && !this.editing) || force) this.reveal(node);
  }

  reveal(node) {
    const box = this.els.scroller.getBoundingClientRect();
    const top = Math.max(box.top, 0);
    const bottom = Math.min(box.bottom, window.innerHeight);
    const r = node.getBoundingClientRect();
    const band = (bottom - top) * 0.2;
    if (r.top < top + band || r.bottom > bottom - band) {
      this.autoScrolled = Date.now();
      node.scrollIntoView({ block: "center", behavior: "smooth" });
    }
  }

  stopFollowing() {
    if (!this.following) return;
    this.following = false;
    this.els.follow.hidden = false;
  }

  resumeFollowing() {
    this.following = true;
    this.els.follow.hidden = true;
    if (this.now) this.reveal(this.now);
  }

  togglePlay() {
    const audio = this.els.audio;
    if (!audio.src) return;
    if (audio.paused) audio.play().catch(() => {});
    else audio.pause();
  }

  skip(seconds) {
    const audio = this.els.audio;
    const end = Number.isFinite(audio.duration) ? audio.duration : this.doc?.duration || 0;
    this.seek(Math.min(Math.max(0, audio.currentTime + seconds), end), !audio.paused);
  }

  faster(step) {
    const audio = this.els.audio;
    const k = SPEEDS.findIndex((s) => s >= audio.playbackRate - 1e-6);
    const next = SPEEDS[Math.min(SPEEDS.length - 1, Math.max(0, (k < 0 ? SPEEDS.length - 1 : k) + step))];
    audio.playbackRate = next;
    this.status(`speed ${next}×`);
  }

  playSpeaker(label) {
    const span = speakerSample(this.doc.segments, label);
    if (!span) return;
    this.seek(span.start, true);
    this.stopAt = span.end;
  }

  // -- correcting --

  edit(text) {
    if (this.editing && this.editing !== text) this.editing.blur();
    const seg = this.doc.segments[Number(text.dataset.n)];
    this.editing = text;
    this.stopFollowing();
    text.textContent = seg.text;
    text.contentEditable = "true";
    text.setAttribute("aria-readonly", "false");
    text.focus();
    const range = document.createRange();
    range.selectNodeContents(text);
    range.collapse(false);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }

  commit(text) {
    this.editing = null;
    const n = Number(text.dataset.n);
    const seg = this.doc.segments[n];
    const value = text.textContent.replace(/\s+/g, " ").trim();
    text.contentEditable = "false";
    if (value === seg.text.trim()) {
      this.renderSegments();
      this.highlight(this.els.audio.currentTime);
      return;
    }
    // Shown at once with the times its unchanged words keep; the server's answer replaces it.
    seg.words = keepWordTimes(seg.words || [], value).map((w) => ({ ...w, start: w.start ?? NaN, end: w.end ?? NaN }));
    seg.text = value;
    this.edited.add(seg.id);
    this.renderSegments();
    this.save({ segments: [{ id: seg.id, text: value }] }, `segment ${n + 1} saved`);
  }

  /** A change saved as a new revision (one at a time, each against the revision it was made on). */
  save(change, said) {
    const id = this.doc.id;
    this.saving = this.saving.then(async () => {
      if (!this.doc || this.doc.id !== id) return;
      const before = this.doc.revision;
      try {
        const doc = await send(`/v1/transcripts/${id}`, "PATCH", { ...change, revision: before });
        this.undo.push(before);
        this.redo = [];
        this.replace(doc);
        this.status(said);
        if (change.title !== undefined || change.speaker_names) this.changed();
      } catch (e) {
        this.status(`not saved: ${e.message}`, true);
        if (e.status === 409) await this.reload();
        else this.render();
      }
    });
    return this.saving;
  }

  replace(doc) {
    if (!this.doc || doc.id !== this.doc.id) return;
    this.doc = doc;
    const ids = new Set(doc.segments.map((s) => s.id));
    for (const sid of [...this.edited]) if (!ids.has(sid)) this.edited.delete(sid);
    const active = document.activeElement;
    const focused = active?.getAttribute?.("aria-label");
    this.render();
    if (focused && active !== document.body) {
      const again = [...document.querySelectorAll("[aria-label]")].find((e) => e.getAttribute("aria-label") === focused);
      again?.focus?.({ preventScroll: true });
    }
    this.highlight(this.els.audio.currentTime);
  }

  async reload() {
    const doc = await json(`/v1/transcripts/${this.doc.id}`);
    this.replace(doc);
  }

  async restore(from, to) {
    if (!from.length || !this.doc) return;
    const id = this.doc.id;
    await this.saving;
    const target = from.pop();
    const before = this.doc.revision;
    try {
      const doc = await json(`/v1/transcripts/${id}/revisions/${target}/restore`, { method: "POST" });
      to.push(before);
      this.replace(doc);
      this.status(`back to revision ${target}`);
      this.changed();
    } catch (e) {
      from.push(target);
      this.status(`not restored: ${e.message}`, true);
    }
    this.buttons();
  }

  undoChange() {
    return this.restore(this.undo, this.redo);
  }

  redoChange() {
    return this.restore(this.redo, this.undo);
  }

  async retime() {
    const ids = [...this.edited];
    if (!ids.length) return;
    await this.saving;
    this.els.retime.disabled = true;
    this.status(`re-timing ${ids.length} segment${ids.length > 1 ? "s" : ""}…`);
    const before = this.doc.revision;
    try {
      const doc = await send(`/v1/transcripts/${this.doc.id}/retime`, "POST", { segments: ids });
      for (const sid of doc.retimed || []) this.edited.delete(sid);
      if (doc.revision !== before) {
        this.undo.push(before);
        this.redo = [];
      }
      this.replace(doc);
      const skipped = Object.values(doc.not_retimed || {});
      this.status(
        `re-timed ${(doc.retimed || []).length} segment(s)` + (skipped.length ? `; not: ${skipped[0]}` : ""),
        skipped.length > 0,
      );
    } catch (e) {
      this.status(`not re-timed: ${e.message}`, true);
      this.buttons();
    }
  }

  rename(title) {
    return this.save({ title }, "renamed");
  }

  async remove() {
    const id = this.doc.id;
    try {
      await json(`/v1/transcripts/${id}`, { method: "DELETE" });
    } catch (e) {
      this.status(`not deleted: ${e.message}`, true);
      return;
    }
    this.close();
    this.deleted(id);
  }

  exportAs(format) {
    return download(`/v1/transcripts/${this.doc.id}/export?format=${format}`, `${this.doc.title}.${format}`)
      .then((name) => this.status(`downloaded ${name}`))
      .catch((e) => this.status(`not exported: ${e.message}`, true));
  }
}

export { STEP_SECONDS };
