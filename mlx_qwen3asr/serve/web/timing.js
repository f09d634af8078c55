// Pure helpers of the page: time formats, which word is being spoken, the timing of edited text,
// speaker colours. No DOM here: tests/web/timing.test.mjs runs these under Node.

/** "m:ss" (or "h:mm:ss" from an hour) for a time in seconds; negative or not finite reads as 0. */
export function formatTime(seconds) {
  const s = Number.isFinite(seconds) && seconds > 0 ? Math.floor(seconds) : 0;
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const ss = String(s % 60).padStart(2, "0");
  return h ? `${h}:${String(m).padStart(2, "0")}:${ss}` : `${m}:${ss}`;
}

/** "m:ss.t" with tenths, for the player's clock. */
export function formatClock(seconds) {
  const s = Number.isFinite(seconds) && seconds > 0 ? seconds : 0;
  return `${formatTime(s)}.${Math.floor((s * 10) % 10)}`;
}

/** Seconds from "h:mm:ss", "m:ss" or "ss" (fractions allowed); NaN when it is not a time. */
export function parseTime(text) {
  const parts = String(text).trim().split(":");
  if (parts.length > 3 || parts.some((p) => !/^\d+(\.\d+)?$/.test(p))) return NaN;
  return parts.reduce((total, p) => total * 60 + Number(p), 0);
}

/**
 * The index of the item being spoken at time t: the last whose start is at or before t, as long as
 * t is before its end (else -1: a pause). starts must be sorted; ends is parallel to it. A binary
 * search, so that every animation frame costs O(log n) over hours of words.
 */
export function activeIndex(starts, ends, t) {
  let lo = 0;
  let hi = starts.length - 1;
  let found = -1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (starts[mid] <= t) {
      found = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return found >= 0 && t < ends[found] ? found : -1;
}

/** Split text into words as the page shows them: runs of non-space, and each CJK character alone. */
export function splitWords(text) {
  const out = [];
  const re = /[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]|[^\s\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]+/gu;
  for (const m of String(text).matchAll(re)) out.push(m[0]);
  return out;
}

/**
 * The words of an edited segment, timed as far as the old timing allows: a word that did not change
 * keeps its time (matched in order by a longest common subsequence), a new word gets null times until
 * the server re-times it. old: [{text, start, end}] as the transcript gives them.
 */
export function keepWordTimes(old, text) {
  const next = splitWords(text);
  const before = old.map((w) => String(w.text).trim());
  const n = before.length;
  const m = next.length;
  // lcs[i][j]: the longest common subsequence of before[i:] and next[j:].
  const lcs = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
  for (let i = n - 1; i >= 0; i--) {
    for (let j = m - 1; j >= 0; j--) {
      lcs[i][j] = before[i] === next[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
    }
  }
  const out = [];
  let i = 0;
  let j = 0;
  while (j < m) {
    if (i < n && before[i] === next[j]) {
      out.push({ text: next[j], start: old[i].start, end: old[i].end });
      i++;
      j++;
    } else if (i < n && lcs[i + 1][j] >= lcs[i][j + 1]) {
      i++;
    } else {
      out.push({ text: next[j], start: null, end: null });
      j++;
    }
  }
  return out;
}

/** Whether a segment's confidence is low: Whisper's threshold on avg_logprob, or a decoding flag. */
export const LOW_LOGPROB = -1.0;
export function isLowConfidence(segment) {
  const p = segment.avg_logprob;
  return Boolean(segment.truncated || segment.repetitive || (typeof p === "number" && p < LOW_LOGPROB));
}

/** A colour for the speaker at position k of the transcript's speakers (stable while it is renamed). */
const PALETTE = ["#2f6fdf", "#c2410c", "#15803d", "#9333ea", "#be123c", "#0e7490", "#a16207", "#4d7c0f"];
export function speakerColour(k) {
  if (k < 0) return "#777";
  const base = PALETTE[k % PALETTE.length];
  return k < PALETTE.length ? base : shade(base, Math.floor(k / PALETTE.length));
}

function shade(hex, turn) {
  const v = parseInt(hex.slice(1), 16);
  const f = (c) => Math.max(0, Math.min(255, Math.round(c * (1 - 0.25 * (turn % 3)))));
  const r = f(v >> 16);
  const g = f((v >> 8) & 255);
  const b = f(v & 255);
  return `#${((r << 16) | (g << 8) | b).toString(16).padStart(6, "0")}`;
}

/** The span of a speaker to play so that a person can tell who it is: its longest segment, at most
 * `seconds` long. segments: [{start, end, speaker}]. null when the speaker has none. */
export function speakerSample(segments, speaker, seconds = 4) {
  let best = null;
  for (const s of segments) {
    if (s.speaker !== speaker || !(s.end > s.start)) continue;
    if (!best || s.end - s.start > best.end - best.start) best = s;
  }
  return best && { start: best.start, end: Math.min(best.end, best.start + seconds) };
}

/**
 * Where each timed word sits in its segment's text, so that the text is shown as written (punctuation,
 * CJK without spaces) with its words marked: [{from, to, k}] (k: the word's index), in order. Words are
 * found left to right from where the previous one ended, whatever their case; one that cannot be found
 * is left out.
 */
export function wordRanges(text, words) {
  const out = [];
  // Found whatever the case, where lower-casing keeps every position (it does but for a few letters).
  const folded = text.toLowerCase();
  const fold = folded.length === text.length;
  const haystack = fold ? folded : text;
  let cursor = 0;
  words.forEach((w, k) => {
    const needle = String(w.text).trim();
    if (!needle) return;
    const at = haystack.indexOf(fold ? needle.toLowerCase() : needle, cursor);
    if (at < 0) return;
    out.push({ from: at, to: at + needle.length, k });
    cursor = at + needle.length;
  });
  return out;
}
