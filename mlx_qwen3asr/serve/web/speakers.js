// The speakers of the transcript in the reader: a name field each (a new name given once, every
// segment follows), a colour each, a sample to hear who is who, and the choice of each segment's speaker.

import { speakerColour } from "./timing.js";

/** The speakers in the order they appear (the transcript's list, then any only a segment names). */
export function speakerLabels(doc) {
  const found = [...(doc.speakers || [])];
  for (const s of doc.segments) if (s.speaker && !found.includes(s.speaker)) found.push(s.speaker);
  return found;
}

/** The speakers panel of the reader's transcript: a colour, a name field and a sample button each. */
export function renderSpeakers(reader) {
  const speakers = speakerLabels(reader.doc);
  reader.els.speakersBox.hidden = speakers.length === 0;
  const items = speakers.map((label, k) => {
    const li = document.createElement("li");
    li.style.setProperty("--c", speakerColour(k));
    const name = document.createElement("input");
    name.type = "text";
    name.value = label;
    name.maxLength = 100;
    name.setAttribute("aria-label", `Name of speaker ${label}`);
    name.addEventListener("keydown", (e) => {
      if (e.key === "Enter") name.blur();
      if (e.key === "Escape") {
        name.value = label;
        name.blur();
      }
    });
    name.addEventListener("change", () => {
      const value = name.value.trim();
      if (value && value !== label) reader.save({ speaker_names: { [label]: value } }, `renamed ${label}`);
      else name.value = label;
    });
    const play = document.createElement("button");
    play.type = "button";
    play.textContent = "▶";
    play.setAttribute("aria-label", `Play a sample of ${label}`);
    play.addEventListener("click", () => reader.playSpeaker(label));
    li.append(name, play);
    return li;
  });
  reader.els.speakers.replaceChildren(...items);
}

/** The list that gives segment n (0-based) to another speaker, saved at once. */
export function speakerChoice(reader, seg, n, speakers) {
  const select = document.createElement("select");
  select.className = "who";
  select.setAttribute("aria-label", `Speaker of segment ${n + 1}`);
  for (const label of ["", ...speakers]) {
    const option = document.createElement("option");
    option.value = label;
    option.textContent = label || "(nobody)";
    option.selected = label === (seg.speaker || "");
    select.append(option);
  }
  select.addEventListener("change", () =>
    reader.save({ segments: [{ id: seg.id, speaker: select.value || null }] }, `segment ${n + 1} given to ${select.value || "nobody"}`),
  );
  return select;
}
