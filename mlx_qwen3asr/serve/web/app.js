// The page: the library (drop recordings, search, open), the transcript read along with its audio,
// live captions. Asks for the API key when the server wants one. Everything it calls is this server's.

import { json, onKeyNeeded } from "./api.js";
import { LibraryList } from "./library.js";
import { Live } from "./live.js";
import { Queue } from "./queue.js";
import { Reader } from "./reader.js";

const $ = (id) => document.getElementById(id);

// -- the status line --

let statusTimer = null;
function status(text, error = false) {
  const el = $("status");
  el.textContent = text;
  el.classList.toggle("error", error);
  clearTimeout(statusTimer);
  if (!error) statusTimer = setTimeout(() => (el.textContent = ""), 6000);
}

// -- the API key, asked once for the tab --

onKeyNeeded((again) => {
  const dialog = $("key-dialog");
  $("key-note").textContent = again ? "That key was refused: try again." : "It is kept for this tab only.";
  $("key").value = "";
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener(
      "close",
      () => resolve(dialog.returnValue === "ok" && $("key").value.trim() ? $("key").value.trim() : null),
      { once: true },
    );
  });
});

function confirmDelete(title) {
  const dialog = $("confirm-dialog");
  $("confirm-text").textContent = `Delete “${title}”, its audio and every revision?`;
  dialog.returnValue = "";
  dialog.showModal();
  return new Promise((resolve) => dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true }));
}

// -- views --

function showView(name) {
  $("show-library").setAttribute("aria-pressed", String(name !== "live"));
  $("show-live").setAttribute("aria-pressed", String(name === "live"));
  $("welcome").hidden = name !== "welcome";
  $("reader").hidden = name !== "reader";
  $("live").hidden = name !== "live";
}

function fillLanguages(select, languages, none) {
  const first = document.createElement("option");
  first.value = "";
  first.textContent = none;
  select.replaceChildren(first);
  for (const name of languages) {
    const option = document.createElement("option");
    option.value = name;
    option.textContent = name;
    select.append(option);
  }
}

function jobOptions(health) {
  return () => {
    const fields = [];
    if ($("language").value) fields.push(["language", $("language").value]);
    if ($("context").value.trim()) fields.push(["prompt", $("context").value.trim()]);
    if ($("words").checked && health.word_timestamps) fields.push(["timestamp_granularities[]", "word"]);
    if ($("diarize").checked && health.diarization) {
      fields.push(["diarize", "true"]);
      if ($("num-speakers").value) fields.push(["num_speakers", $("num-speakers").value]);
      if ($("speaker-names").value.trim()) fields.push(["speaker_names", $("speaker-names").value.trim()]);
    }
    return fields;
  };
}

async function main() {
  let health;
  try {
    health = await json("/health");
  } catch (e) {
    status(`The server cannot be used: ${e.message}`, true);
    return;
  }
  fillLanguages($("language"), health.languages || [], "Detect");
  fillLanguages($("live-language"), health.languages || [], "Detect");
  $("words").disabled = !health.word_timestamps;
  $("words").checked = Boolean(health.word_timestamps);
  for (const id of ["diarize", "num-speakers", "speaker-names"]) $(id).disabled = !health.diarization;
  if (!health.word_timestamps) $("words").closest("label").title = "this server has no forced aligner";
  if (!health.diarization) $("diarize").closest("label").title = "this server was started without --diarize";

  const reader = new Reader(
    {
      title: $("title"),
      meta: $("meta"),
      audio: $("audio"),
      speed: $("speed"),
      follow: $("follow"),
      speakersBox: $("speakers-box"),
      speakers: $("speakers"),
      segments: $("segments"),
      undo: $("undo"),
      redo: $("redo"),
      retime: $("retime"),
      exportFormat: $("export-format"),
      scroller: window.matchMedia("(max-width: 800px)").matches ? document.scrollingElement : $("main"),
    },
    {
      status,
      changed: () => list.refresh(),
      deleted: () => {
        list.setCurrent(null);
        list.refresh();
        showView("welcome");
        status("deleted");
      },
    },
  );

  const open = async (id, at = null) => {
    try {
      await reader.open(id, at);
    } catch (e) {
      status(`cannot open it: ${e.message}`, true);
      return;
    }
    list.setCurrent(id);
    showView("reader");
    history.replaceState(null, "", `#${id}`);
  };

  const list = new LibraryList({ list: $("transcripts"), search: $("search"), more: $("more"), note: $("search-note") }, open, status);

  const queue = new Queue(
    { list: $("queue"), input: $("files"), drop: $("drop") },
    jobOptions(health),
    (id, name) => {
      status(`${name}: done`);
      list.refresh();
      if (!reader.doc) open(id);
    },
    status,
    health.max_job_upload_bytes,
  );

  new Live(
    {
      start: $("live-start"),
      stop: $("live-stop"),
      language: $("live-language"),
      save: $("live-save"),
      state: $("live-state"),
      stable: document.querySelector("#live-text .stable"),
      unstable: document.querySelector("#live-text .unstable"),
    },
    (id) => {
      list.refresh();
      status("the live session was saved to the library");
      $("live-state").textContent = "saved to the library: ";
      const link = document.createElement("button");
      link.type = "button";
      link.textContent = "open the transcript";
      link.addEventListener("click", () => open(id));
      $("live-state").append(link);
    },
    status,
  );
  $("live-save").disabled = !health.library;
  $("live-save").checked = Boolean(health.library);

  // The transcript's toolbar.
  $("rename").addEventListener("click", () => {
    $("rename-form").hidden = false;
    $("title").hidden = true;
    $("title-input").value = reader.doc.title;
    $("title-input").focus();
    $("title-input").select();
  });
  const endRename = () => {
    $("rename-form").hidden = true;
    $("title").hidden = false;
  };
  $("rename-cancel").addEventListener("click", endRename);
  $("title-input").addEventListener("keydown", (e) => e.key === "Escape" && endRename());
  $("rename-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const title = $("title-input").value.trim();
    endRename();
    if (title && title !== reader.doc.title) await reader.rename(title);
    $("rename").focus();
  });
  $("delete").addEventListener("click", async () => {
    if (await confirmDelete(reader.doc.title)) reader.remove();
  });
  $("undo").addEventListener("click", () => reader.undoChange());
  $("redo").addEventListener("click", () => reader.redoChange());
  $("retime").addEventListener("click", () => reader.retime());
  $("export").addEventListener("click", () => reader.exportAs($("export-format").value));

  $("show-library").addEventListener("click", () => showView(reader.doc ? "reader" : "welcome"));
  $("show-live").addEventListener("click", () => showView("live"));

  // Keys: the player's, when no field has the focus.
  document.addEventListener("keydown", (e) => {
    const t = e.target;
    const typing = t.closest?.("input, textarea, select, [contenteditable='true']");
    if (typing) return;
    if (e.key === "/" && !e.ctrlKey && !e.metaKey) {
      e.preventDefault();
      $("search").focus();
      return;
    }
    if ($("reader").hidden || !reader.doc) return;
    const mod = e.ctrlKey || e.metaKey;
    if (mod && e.key.toLowerCase() === "z") {
      e.preventDefault();
      if (e.shiftKey) reader.redoChange();
      else reader.undoChange();
      return;
    }
    if (mod && e.key.toLowerCase() === "y") {
      e.preventDefault();
      reader.redoChange();
      return;
    }
    if (mod || e.altKey) return;
    const onControl = t.closest?.("button, summary, a, audio");
    const keys = {
      " ": () => reader.togglePlay(),
      k: () => reader.togglePlay(),
      j: () => reader.skip(-5),
      ArrowLeft: () => reader.skip(-5),
      l: () => reader.skip(5),
      ArrowRight: () => reader.skip(5),
      ",": () => reader.faster(-1),
      "<": () => reader.faster(-1),
      ".": () => reader.faster(1),
      ">": () => reader.faster(1),
      f: () => reader.resumeFollowing(),
    };
    const action = keys[e.key];
    if (!action || (onControl && (e.key === " " || t.tagName === "AUDIO"))) return;
    e.preventDefault();
    action();
  });

  if (health.library) {
    await list.refresh();
    queue.resume().catch((e) => status(`jobs: ${e.message}`, true));
    const wanted = location.hash.slice(1);
    if (/^[0-9a-f]{6,64}$/.test(wanted)) await open(wanted);
  } else {
    $("add").hidden = true;
    $("library").hidden = true;
    $("welcome").querySelector("p").textContent =
      "This server keeps no transcript library (it was started with --no-library): live captions only.";
  }
  document.body.dataset.ready = "true";
}

main();
