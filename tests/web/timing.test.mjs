// The page's pure helpers (mlx_qwen3asr/serve/web/timing.js), run with `node --test tests/web/`
// (tests/test_web_units.py runs them in the suite).
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  activeIndex,
  formatClock,
  formatTime,
  isLowConfidence,
  keepWordTimes,
  parseTime,
  speakerColour,
  speakerSample,
  splitWords,
  wordRanges,
} from "../../mlx_qwen3asr/serve/web/timing.js";

test("times are written m:ss, h:mm:ss from an hour, and read back", () => {
  assert.equal(formatTime(0), "0:00");
  assert.equal(formatTime(59.99), "0:59");
  assert.equal(formatTime(61), "1:01");
  assert.equal(formatTime(3600 + 5 * 60 + 7), "1:05:07");
  assert.equal(formatTime(-3), "0:00");
  assert.equal(formatTime(NaN), "0:00");
  assert.equal(formatClock(75.46), "1:15.4");
  assert.equal(parseTime("1:05:07"), 3907);
  assert.equal(parseTime("2:03.5"), 123.5);
  assert.equal(parseTime("42"), 42);
  assert.ok(Number.isNaN(parseTime("1:xx")));
  assert.ok(Number.isNaN(parseTime("1:2:3:4")));
});

test("the word being spoken is found by binary search, none in a pause", () => {
  const starts = [0.0, 0.5, 1.0, 3.0];
  const ends = [0.4, 0.9, 2.0, 3.5];
  assert.equal(activeIndex(starts, ends, -1), -1);
  assert.equal(activeIndex(starts, ends, 0), 0);
  assert.equal(activeIndex(starts, ends, 0.45), -1); // between words
  assert.equal(activeIndex(starts, ends, 0.5), 1);
  assert.equal(activeIndex(starts, ends, 1.99), 2);
  assert.equal(activeIndex(starts, ends, 2.5), -1);
  assert.equal(activeIndex(starts, ends, 3.2), 3);
  assert.equal(activeIndex(starts, ends, 9), -1);
  assert.equal(activeIndex([], [], 1), -1);
  // A long transcript: every word found at its own start.
  const n = 100000;
  const s = Float64Array.from({ length: n }, (_, k) => k * 0.3);
  const e = Float64Array.from({ length: n }, (_, k) => k * 0.3 + 0.2);
  for (const k of [0, 1, 777, 54321, n - 1]) assert.equal(activeIndex(s, e, k * 0.3 + 0.1), k);
});

test("words are split on spaces, each CJK character on its own", () => {
  assert.deepEqual(splitWords("Hello,  big world"), ["Hello,", "big", "world"]);
  assert.deepEqual(splitWords("東京へ行く"), ["東", "京", "へ", "行", "く"]);
  assert.deepEqual(splitWords("我在 Apple 工作"), ["我", "在", "Apple", "工", "作"]);
  assert.deepEqual(splitWords("  "), []);
});

test("an edited segment's unchanged words keep their times, new words have none", () => {
  const old = [
    { text: "the", start: 0, end: 0.2 },
    { text: "quick", start: 0.2, end: 0.5 },
    { text: "brown", start: 0.5, end: 0.8 },
    { text: "fox", start: 0.8, end: 1.0 },
  ];
  assert.deepEqual(keepWordTimes(old, "the quick red fox"), [
    { text: "the", start: 0, end: 0.2 },
    { text: "quick", start: 0.2, end: 0.5 },
    { text: "red", start: null, end: null },
    { text: "fox", start: 0.8, end: 1.0 },
  ]);
  // A word moved: only the longest run in order keeps its times.
  const moved = keepWordTimes(old, "fox the quick brown");
  assert.deepEqual(
    moved.map((w) => w.start),
    [null, 0, 0.2, 0.5],
  );
  assert.deepEqual(keepWordTimes(old, ""), []);
  assert.deepEqual(keepWordTimes([], "new words"), [
    { text: "new", start: null, end: null },
    { text: "words", start: null, end: null },
  ]);
});

test("timed words are found in the segment's text as written", () => {
  const text = "Hello, world. 東京です";
  const words = [{ text: "Hello" }, { text: "world" }, { text: "東京" }, { text: "missing" }, { text: "です" }];
  assert.deepEqual(wordRanges(text, words), [
    { from: 0, to: 5, k: 0 },
    { from: 7, to: 12, k: 1 },
    { from: 14, to: 16, k: 2 },
    { from: 16, to: 18, k: 4 },
  ]);
  // Case differs: still found; a repeated word is found after the previous one.
  assert.deepEqual(wordRanges("The the", [{ text: "the" }, { text: "the" }]), [
    { from: 0, to: 3, k: 0 },
    { from: 4, to: 7, k: 1 },
  ]);
  assert.deepEqual(wordRanges("Go go", [{ text: "go" }, { text: "GO" }, { text: "go" }]), [
    { from: 0, to: 2, k: 0 },
    { from: 3, to: 5, k: 1 },
  ]);
});

test("low confidence: avg_logprob under -1, or a truncated or repetitive segment", () => {
  assert.equal(isLowConfidence({ avg_logprob: -0.2 }), false);
  assert.equal(isLowConfidence({ avg_logprob: -1.5 }), true);
  assert.equal(isLowConfidence({ avg_logprob: null }), false);
  assert.equal(isLowConfidence({ avg_logprob: -0.1, repetitive: true }), true);
  assert.equal(isLowConfidence({ avg_logprob: -0.1, truncated: true }), true);
});

test("speakers get distinct colours; a sample is the speaker's longest segment, cut short", () => {
  const colours = new Set(Array.from({ length: 16 }, (_, k) => speakerColour(k)));
  assert.equal(colours.size, 16);
  assert.equal(speakerColour(-1), "#777");
  const segments = [
    { start: 0, end: 2, speaker: "A" },
    { start: 2, end: 12, speaker: "B" },
    { start: 12, end: 15, speaker: "A" },
  ];
  assert.deepEqual(speakerSample(segments, "A"), { start: 12, end: 15 });
  assert.deepEqual(speakerSample(segments, "B"), { start: 2, end: 6 });
  assert.equal(speakerSample(segments, "C"), null);
});
