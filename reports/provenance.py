"""What a report says about where its numbers came from beyond the runs: the data sets the study
trained and scored on (each split's rows and sha256, as the launch recorded them) and the plugins
whose names it used (distribution and version), read from the study record."""

from __future__ import annotations

from typing import Any

from reports.record import StudyRecord


def record_provenance(record: StudyRecord | None) -> dict[str, Any]:
    """The record's data sets and plugins, for provenance.json (empty for records from before them)."""
    if record is None:
        return {}
    return {"data": [d.model_dump(mode="json") for d in record.data],
            "plugins": [p.model_dump(mode="json") for p in record.plugins]}


def provenance_lines(record: StudyRecord | None) -> list[str]:
    """Markdown lines naming each data set (its origin, each split's rows and sha256) and each plugin."""
    if record is None:
        return []
    lines = []
    for data in record.data:
        splits = "; ".join(f"{split} {part.rows:,} rows, sha256 `{part.sha256[:16]}`"
                           for split, part in data.splits.items())
        language = f", {data.language}" if data.language != "en" else ""
        lines.append(f"Data set **{data.name}** ({data.kind}{language}; {data.origin}): {splits}.")
        if data.overlap:
            lines.append(f"{data.overlap:,} test pairs of {data.name} are also train pairs.")
    if record.plugins:
        lines.append("Plugins: " + ", ".join(f"{p.name} ({p.group}, {p.distribution} {p.version})"
                                             for p in record.plugins) + ".")
    return [*lines, ""] if lines else []
