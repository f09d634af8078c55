// The server's API as the page calls it: every request carries the API key when the server wants one
// (asked once, kept for the tab in sessionStorage), errors become ApiError with the server's one line.

const KEY_ITEM = "mlxasr.key";
const KEY_PROTOCOL = "openai-insecure-api-key.";

export class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code || null;
  }
}

let askForKey = null; // set by the page: resolves to a key the person typed

export function onKeyNeeded(ask) {
  askForKey = ask;
}

export function apiKey() {
  return sessionStorage.getItem(KEY_ITEM);
}

export function forgetKey() {
  sessionStorage.removeItem(KEY_ITEM);
}

function headers(extra) {
  const h = new Headers(extra || {});
  const key = apiKey();
  if (key) h.set("Authorization", `Bearer ${key}`);
  return h;
}

async function errorOf(response) {
  let message = `${response.status} ${response.statusText}`;
  let code = null;
  try {
    const body = await response.json();
    if (body && body.error) {
      message = body.error.message || message;
      code = body.error.code || null;
    }
  } catch {
    // not JSON: the status line says it
  }
  return new ApiError(response.status, message, code);
}

/** fetch with the key; a 401 asks for the key (once per refusal) and tries again. */
export async function call(path, options = {}) {
  for (let attempt = 0; ; attempt++) {
    let response;
    try {
      response = await fetch(path, { ...options, headers: headers(options.headers) });
    } catch {
      throw new ApiError(0, "the server cannot be reached", "unreachable");
    }
    if (response.status === 401 && askForKey && attempt < 3) {
      const key = await askForKey(attempt > 0);
      if (!key) throw await errorOf(response);
      sessionStorage.setItem(KEY_ITEM, key);
      continue;
    }
    if (!response.ok) throw await errorOf(response);
    return response;
  }
}

export async function json(path, options = {}) {
  const response = await call(path, options);
  return response.json();
}

export function send(path, method, body) {
  return json(path, {
    method,
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
}

/**
 * Server-sent events read through fetch (EventSource cannot send the key): calls onEvent(name, data)
 * for each event until the stream ends or signal aborts.
 */
export async function events(path, onEvent, signal) {
  const response = await call(path, { signal });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let name = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
      }
      if (data.length) onEvent(name, JSON.parse(data.join("\n")));
    }
  }
}

/** A file the server renders, saved through the browser's download (named as the server says). */
export async function download(path, fallbackName) {
  const response = await call(path);
  const blob = await response.blob();
  const disposition = response.headers.get("Content-Disposition") || "";
  const utf8 = /filename\*=UTF-8''([^;]+)/i.exec(disposition);
  const plain = /filename="([^"]+)"/i.exec(disposition);
  const name = utf8 ? decodeURIComponent(utf8[1]) : plain ? plain[1] : fallbackName;
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
  return name;
}

/** The URL an <audio> element plays a transcript's recording from: the server's own (HTTP Range)
 * on an open server; with a key (which an <audio> element cannot send), the recording as a blob. */
export async function audioURL(id) {
  const path = `/v1/transcripts/${id}/audio`;
  if (!apiKey()) return { url: path, revoke: () => {} };
  const blob = await (await call(path)).blob();
  const url = URL.createObjectURL(blob);
  return { url, revoke: () => URL.revokeObjectURL(url) };
}

/** The realtime WebSocket, with the key as OpenAI's subprotocol (a browser cannot set its headers). */
export function liveSocket() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const key = apiKey();
  const protocols = ["realtime", ...(key ? [KEY_PROTOCOL + key] : [])];
  const ws = new WebSocket(`${scheme}://${location.host}/v1/realtime/transcription`, protocols);
  ws.binaryType = "arraybuffer";
  return ws;
}
