// Recordings dropped or chosen on the page: each is uploaded as a library job (POST /v1/jobs), then
// followed through its events until it is done (its transcript opens in the list), failed (its one
// line shown) or cancelled. Jobs still unfinished when the page loads (a reload, a restarted server)
// are picked up again.

import { ApiError, apiKey, events, json } from "./api.js";

const FINISHED = new Set(["done", "failed", "cancelled"]);
const RETRY_MS = 2000; // while the server cannot be reached (restarting), the job is looked at again

export class Queue {
  /** els: {list, input, drop}; options(): the job's form fields; onDone(transcriptId, title). */
  constructor(els, options, onDone, status, maxBytes = null) {
    this.els = els;
    this.maxBytes = maxBytes; // the server's limit on a job's upload
    this.options = options;
    this.onDone = onDone;
    this.status = status;
    this.items = new Map(); // job id -> item
    els.input.addEventListener("change", () => {
      this.add([...els.input.files]);
      els.input.value = "";
    });
    const drop = els.drop;
    const over = (on) => (e) => {
      e.preventDefault();
      drop.classList.toggle("over", on);
    };
    drop.addEventListener("dragenter", over(true));
    drop.addEventListener("dragover", over(true));
    drop.addEventListener("dragleave", over(false));
    drop.addEventListener("drop", (e) => {
      over(false)(e);
      this.add([...(e.dataTransfer?.files || [])]);
    });
    // A file dropped anywhere else on the page is taken too, rather than opened by the browser.
    window.addEventListener("dragover", (e) => e.preventDefault());
    window.addEventListener("drop", (e) => {
      e.preventDefault();
      if (!drop.contains(e.target)) this.add([...(e.dataTransfer?.files || [])]);
    });
  }

  add(files) {
    for (const file of files) this.upload(file);
  }

  /** Jobs the library still holds unfinished: shown and followed again. */
  async resume() {
    const jobs = await json("/v1/jobs?limit=100");
    for (const job of jobs.data.reverse()) {
      if (!FINISHED.has(job.status) && !this.items.has(job.id)) {
        const item = this.item(job.title || "Untitled");
        item.id = job.id;
        this.items.set(job.id, item);
        this.show(item, job);
        this.follow(item);
      }
    }
  }

  item(name) {
    const li = document.createElement("li");
    const label = document.createElement("span");
    label.className = "name";
    label.textContent = name;
    const cancel = document.createElement("button");
    cancel.type = "button";
    cancel.textContent = "Cancel";
    cancel.setAttribute("aria-label", `Cancel ${name}`);
    const progress = document.createElement("progress");
    progress.max = 1;
    progress.value = 0;
    progress.setAttribute("aria-label", `Progress of ${name}`);
    const state = document.createElement("span");
    state.className = "state";
    li.append(label, cancel, progress, state);
    this.els.list.prepend(li);
    const item = { name, li, cancel, progress, state, id: null, xhr: null, finished: false };
    cancel.addEventListener("click", () => this.cancel(item));
    return item;
  }

  setState(item, text, kind = "") {
    item.state.textContent = text;
    item.li.className = kind;
    item.li.dataset.state = kind || "working";
  }

  upload(file) {
    const item = this.item(file.name);
    if (this.maxBytes && file.size > this.maxBytes) {
      const size = (n) => (n < 1048576 ? `${Math.round(n / 1024)} KB` : `${(n / 1048576).toFixed(1)} MB`);
      this.fail(item, `${size(file.size)} is larger than this server takes (${size(this.maxBytes)}; mlxasr serve --max-job-upload-mb)`);
      return;
    }
    if (file.size === 0) {
      this.fail(item, "the file is empty");
      return;
    }
    const form = new FormData();
    form.append("file", file, file.name);
    for (const [k, v] of this.options()) form.append(k, v);
    this.setState(item, "uploading…");
    const xhr = new XMLHttpRequest();
    item.xhr = xhr;
    xhr.open("POST", "/v1/jobs");
    const key = apiKey();
    if (key) xhr.setRequestHeader("Authorization", `Bearer ${key}`);
    xhr.upload.onprogress = (e) => {
      if (e.lengthComputable) this.setState(item, `uploading ${Math.round((100 * e.loaded) / e.total)}%`);
    };
    xhr.onerror = () => this.fail(item, "the upload failed: the server refused it or cannot be reached");
    xhr.onabort = () => this.end(item, "cancelled", "cancelled");
    xhr.onload = () => {
      item.xhr = null;
      let body = null;
      try {
        body = JSON.parse(xhr.responseText);
      } catch {
        body = null;
      }
      if (xhr.status !== 202 || !body) {
        const message = body?.error?.message || `the server answered ${xhr.status}`;
        this.fail(item, message);
        return;
      }
      item.id = body.id;
      this.items.set(body.id, item);
      this.setState(item, "queued");
      this.follow(item);
    };
    xhr.send(form);
  }

  show(item, job) {
    if (job.status === "running") {
      item.progress.value = job.progress || 0;
      this.setState(item, `transcribing ${Math.round(100 * (job.progress || 0))}%`);
    } else if (job.status === "queued") {
      this.setState(item, "queued");
    } else if (job.status === "done") {
      item.progress.value = 1;
      this.end(item, "done", "done");
      this.onDone(job.transcript_id, item.name);
    } else if (job.status === "failed") {
      this.fail(item, job.error || "the job failed");
    } else if (job.status === "cancelled") {
      this.end(item, "cancelled", "cancelled");
    }
  }

  async follow(item) {
    while (!item.finished) {
      try {
        await events(`/v1/jobs/${item.id}/events`, (name, data) => {
          if (name === "job") this.show(item, data);
          else if (name === "error") this.fail(item, data.error || "the job is gone");
        });
        if (!item.finished) this.show(item, await json(`/v1/jobs/${item.id}`));
      } catch (e) {
        if (e instanceof ApiError && e.status === 404) {
          this.fail(item, "the job is gone from the library");
          return;
        }
        if (e instanceof ApiError && e.code === "unreachable") {
          this.setState(item, "waiting for the server…");
        } else if (e instanceof ApiError) {
          this.fail(item, e.message);
          return;
        }
      }
      if (!item.finished) await new Promise((r) => setTimeout(r, RETRY_MS));
    }
  }

  async cancel(item) {
    if (item.finished) {
      item.li.remove();
      return;
    }
    if (item.xhr) {
      item.xhr.abort();
      return;
    }
    if (!item.id) return;
    try {
      const job = await json(`/v1/jobs/${item.id}`, { method: "DELETE" });
      this.show(item, job);
    } catch (e) {
      this.status(`${item.name}: ${e.message}`, true);
    }
  }

  fail(item, line) {
    this.end(item, line, "failed");
  }

  end(item, text, kind) {
    if (item.finished) return;
    item.finished = true;
    this.setState(item, text, kind);
    item.cancel.textContent = "Remove";
    item.cancel.setAttribute("aria-label", `Remove ${item.name}`);
  }
}
