"""The transcript library: every transcript kept in one folder (an SQLite database and each transcript's
audio), searchable across all of them, edited in revisions, exported in every format.

    store.py        the Library, and every name of the store; the folder a library is kept in by default
    errors.py       the library's errors (LibraryError, NotFound, Conflict, UnknownSegment)
    schema.py       the schema's migrations, and opening the database (WAL, pragmas, schema version)
    files.py        the kept audio: safe suffixes, atomic copy or link into its folder, orphan cleanup
    values.py       the stored values checked: titles, speaker labels, options, content, new words
    database.py     an opened library folder: its connection, read and write transactions, cleanup
    transcripts.py  transcripts and their revisions: add, read, list, change, restore, delete
    jobs_table.py   the job rows: add, read, list, change, finish (with the transcript), delete
    search.py       full-text search (FTS5, trigram: every language, Chinese and Japanese included)
    edits.py        an edited segment's words: unchanged words keep their times
    retime.py       edited segments timed again against their kept audio
    export.py       a transcript as TXT, SRT, WebVTT, JSON, RTTM, CSV, Markdown or DOCX
    jobs.py         transcription jobs that outlive the server, run on the engine
"""
