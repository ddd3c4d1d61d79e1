"""What logrotate's retention explains: the files of a log that are gone on purpose.

Every new file of a log begins with a ``rotate`` record numbering it
(:data:`mcpd.common.audit.chain.ROTATE`), and the shipped logrotate file says how many rotated
files it keeps (``rotate N``). :class:`History` puts the two together, so ``mcpd audit verify``
accepts a chain that begins after seq 1 only when the files missing before the oldest one read
are those logrotate removed, and otherwise says what is known of them.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass

from mcpd.admin.audit.logfiles import first_record
from mcpd.common.audit.chain import file_number_of

#: where the shipped logrotate file is installed: its ``rotate N`` says how many old files of a log are kept
LOGROTATE_FILE = "/etc/logrotate.d/mcpd"

def logrotate_keeps(conf: str, log: str) -> int | None:
    """How many rotated files of ``log`` (an absolute path) the logrotate file ``conf`` keeps: the
    ``rotate N`` of the block naming it (a path or a glob), else of the file's top level; None
    when the file cannot be read or does not name the log."""
    try:
        with open(conf, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError:
        return None
    default: int | None = None
    names: list[str] = []
    inside: list[str] | None = None
    keeps: int | None = None
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        while words:
            word = words.pop(0)
            if inside is None and word.endswith("{"):
                names += [word[:-1]] if word[:-1] else []
                inside, keeps = names, None
                names = []
            elif inside is None:
                if word == "rotate" and words and words[0].isdigit():
                    default = int(words.pop(0))
                else:
                    names.append(word)
            elif word == "}":
                if any(fnmatch.fnmatchcase(log, n.strip('"')) for n in inside):
                    return keeps if keeps is not None else default
                inside = None
            elif word == "rotate" and words and words[0].isdigit():
                keeps = int(words.pop(0))
    return None


@dataclass(frozen=True)
class History:
    """What the files of a log say about the files before them: the number of the oldest and of
    the newest file read (their first record, see :data:`mcpd.common.audit.chain.ROTATE`), the oldest
    file's first ``seq``, and how many rotated files logrotate keeps (``keeps``, from ``conf``;
    None when not known or when the files were given by hand)."""

    paths: tuple[str, ...]
    oldest: int | None
    newest: int | None
    first_seq: int | None
    keeps: int | None
    conf: str

    @classmethod
    def of(cls, paths: list[str], live: str | None, conf: str) -> History:
        """The history of ``paths`` (oldest first); ``live``: the log they are the whole set of
        (None: files given by hand, whose retention is not judged)."""
        first, last = first_record(paths[0]), first_record(paths[-1])
        seq = first.get("seq") if first else None
        return cls(tuple(paths), file_number_of(first), file_number_of(last), seq if type(seq) is int else None,
                   logrotate_keeps(conf, os.path.abspath(live)) if live else None, conf)

    def accepted_start(self) -> int:
        """The ``seq`` history may begin at: the oldest file's first when logrotate's retention
        explains every file missing before it (the oldest kept is at least the newest's number
        less ``keeps``), else 1."""
        o, n, k = self.oldest, self.newest, self.keeps
        if o is not None and n is not None and k is not None and self.first_seq and 1 < o <= n - k:
            return self.first_seq
        return 1

    def retention_words(self) -> str:
        """Why the records before the oldest file are not missing (see :meth:`accepted_start`)."""
        return (f"seq 1..{(self.first_seq or 1) - 1} (the log's files 1..{(self.oldest or 1) - 1}) were removed by "
                f"logrotate's retention: it keeps {self.keeps} rotated files ({self.conf}) and this log has had "
                f"{self.newest} files")

    def missing_hints(self, first_seq: int, given: bool) -> list[str]:
        """Lines explaining a chain that does not begin at seq 1 (``first_seq`` its first)."""
        o, n, k = self.oldest, self.newest, self.keeps
        hints = []
        if o is not None and o > 1:
            hints.append(f"the oldest file read, {self.paths[0]}, is the log's file {o}: the {o - 1} file"
                         f"{'s' * (o > 2)} before it {'are' if o > 2 else 'is'} not here")
        elif o is None:
            hints.append(f"the oldest file read, {self.paths[0]}, does not say which file of the log it is (written "
                         "before files were numbered, or its first record is gone)")
        if given:
            hints.append("the files given may not be all of them: without FILE arguments verify reads the whole set")
        elif k is not None and o is not None and n is not None and o > 1:
            hints.append(f"logrotate keeps {k} rotated files of this log ({self.conf}) and it has had {n} files: it "
                         f"would still keep file{'s' * (o - 1 > max(1, n - k))} {max(1, n - k)}"
                         f"{f'..{o - 1}' if o - 1 > max(1, n - k) else ''}, so they were removed by other means")
        elif k is None:
            hints.append(f"{self.conf} does not say how many files of this log logrotate keeps")
        hints.append(f"if they were removed on purpose, --since-seq {first_seq} accepts a history that begins there")
        return hints
