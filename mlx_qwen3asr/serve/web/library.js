// The library's list: every transcript newest first, or, while something is typed in the search box,
// the segments it finds across all of them (as you type; a stale answer is dropped). A transcript
// opens at its start, a hit at the hit's time.

import { json } from "./api.js";
import { formatTime } from "./timing.js";

const PAGE = 50;
const TYPING_MS = 120;

/** The server's snippet (escaped text with <mark> around the hit) as DOM nodes, nothing else kept. */
function snippetNodes(html) {
  const template = document.createElement("template");
  template.innerHTML = html;
  const out = [];
  for (const node of template.content.childNodes) {
    if (node.nodeType === Node.TEXT_NODE) out.push(document.createTextNode(node.textContent));
    else if (node.nodeName === "MARK") {
      const mark = document.createElement("mark");
      mark.textContent = node.textContent;
      out.push(mark);
    }
  }
  return out;
}

function span(className, text) {
  const el = document.createElement("span");
  el.className = className;
  el.textContent = text;
  return el;
}

function when(seconds) {
  return new Date(seconds * 1000).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" });
}

export class LibraryList {
  /** els: {list, search, more, note}; onOpen(id, at). */
  constructor(els, onOpen, status) {
    this.els = els;
    this.onOpen = onOpen;
    this.status = status;
    this.shown = 0;
    this.current = null;
    this.asked = 0; // the number of the latest request: older answers are dropped
    this.timer = null;
    els.search.addEventListener("input", () => {
      clearTimeout(this.timer);
      this.timer = setTimeout(() => this.refresh(), TYPING_MS);
    });
    els.search.addEventListener("keydown", (e) => {
      if (e.key === "Escape" && els.search.value) {
        els.search.value = "";
        this.refresh();
      }
    });
    els.more.addEventListener("click", () => this.load(this.shown));
  }

  query() {
    return this.els.search.value.trim();
  }

  refresh() {
    return this.load(0);
  }

  async load(offset) {
    const ask = ++this.asked;
    const q = this.query();
    const params = new URLSearchParams({ limit: String(PAGE), offset: String(offset) });
    if (q) params.set("q", q);
    let page;
    try {
      page = await json(`/v1/transcripts?${params}`);
    } catch (e) {
      if (ask === this.asked) this.els.note.textContent = q ? `Search: ${e.message}` : e.message;
      return;
    }
    if (ask !== this.asked) return;
    if (offset === 0) this.els.list.replaceChildren();
    for (const entry of page.data) this.els.list.append(q ? this.hit(entry) : this.entry(entry));
    this.shown = offset + page.data.length;
    const total = page.total ?? null;
    this.els.more.hidden = total !== null ? this.shown >= total : page.data.length < PAGE;
    if (q) {
      this.els.note.textContent = this.shown ? "" : `Nothing found for “${q}”.`;
    } else {
      this.els.note.textContent = this.shown ? "" : "No transcripts yet: drop a recording above.";
    }
    this.mark();
  }

  button(id, at, parts) {
    const li = document.createElement("li");
    const b = document.createElement("button");
    b.type = "button";
    b.dataset.id = id;
    b.append(...parts);
    b.addEventListener("click", () => this.onOpen(id, at));
    li.append(b);
    return li;
  }

  entry(t) {
    const meta = [when(t.created), t.duration ? formatTime(t.duration) : null, t.language || null];
    return this.button(t.id, null, [
      span("t-title", t.title),
      span("t-meta", meta.filter(Boolean).join(" · ")),
      span("t-meta t-preview", t.preview || ""),
    ]);
  }

  hit(h) {
    const snippet = span("t-snippet", "");
    snippet.append(...snippetNodes(h.snippet || ""));
    const title = span("t-title", h.title);
    const meta = span("t-meta", `at ${formatTime(h.start)}`);
    const li = this.button(h.transcript_id, h.start, [title, meta, snippet]);
    li.firstChild.setAttribute("aria-label", `${h.title} at ${formatTime(h.start)}: ${h.text}`);
    return li;
  }

  /** Marks the open transcript in the list. */
  setCurrent(id) {
    this.current = id;
    this.mark();
  }

  mark() {
    for (const b of this.els.list.querySelectorAll("button")) {
      if (b.dataset.id === this.current) b.setAttribute("aria-current", "true");
      else b.removeAttribute("aria-current");
    }
  }
}
