"""What `ftbus campaign NAME` shows: a campaign's incumbent, the incumbents in order, and every judged
candidate with its comparison (shared/campaigns.py). Rendering only: the command is in ftbus/cli_results.py."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape

from ftbus.cli_common import print_columns
from shared.campaigns import CampaignEntry, CampaignRecord

HEADERS = ("#", "request", "judged", "compared with", "level", "decision", "comparison")


def campaign_json(record: CampaignRecord) -> dict[str, Any]:
    """The record as stored, plus what is derived from it: the incumbents in order and the next level."""
    return {**record.model_dump(mode="json"), "incumbents": [e.request_id for e in record.incumbents],
            "next_level": record.state.next_level()}


def _row(entry: CampaignEntry) -> list[str]:
    return [
        str(entry.index) if entry.index is not None else "-",
        entry.request_id,
        entry.judged_at.strftime("%Y-%m-%d %H:%M:%S"),
        entry.incumbent or "the base model",
        f"{entry.level:.4g}" if entry.level is not None else "-",
        "accepted" if entry.accepted else "refused",
        entry.summary,
    ]


def render_campaign(out: Console, record: CampaignRecord, as_json: bool = False) -> None:
    if as_json:
        print(json.dumps(campaign_json(record)))
        return
    state = record.state
    out.print(escape(
        f"campaign {record.name}: {record.benchmark} with base model {record.base_model}; "
        f"{state.tests} candidate{'' if state.tests == 1 else 's'} tested ({record.procedure}, at most "
        f"{state.alpha:g} chance of any false acceptance); the next one-sided level is {state.next_level():.4g}"),
        highlight=False, soft_wrap=True)
    if record.incumbent is None:
        out.print("incumbent: none yet (the next candidate is compared with the base model)", highlight=False)
    else:
        accepted = record.entry(record.incumbent)
        when = f", accepted {accepted.judged_at:%Y-%m-%d %H:%M:%S}" if accepted is not None else ""
        out.print(escape(f"incumbent: {record.incumbent}{when}"), highlight=False, soft_wrap=True)
        if len(record.incumbents) > 1:
            earlier = "" if record.accepted <= len(record.incumbents) else \
                f" (the last {len(record.incumbents)} of {record.accepted})"
            out.print(escape(f"incumbents in order{earlier}: " + " -> ".join(e.request_id for e in record.incumbents)),
                      highlight=False, soft_wrap=True)
    if record.judged > len(record.history):
        out.print(f"{record.judged} judged, the last {len(record.history)} shown", highlight=False)
    print_columns(out, HEADERS, [_row(e) for e in record.history], title=f"{record.judged} judged")
