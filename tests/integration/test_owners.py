"""Owners on a real nats-server under the generated permissions, with two agent identities (`python -m
ftbus.permissions --agents agent,rival`): each submits as itself only, spends its own error budget, and
cannot enter the other's campaign, through the client or around it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ftbus.cli import run_services
from ftbus.client import Client
from shared.artifacts import upload_dir
from shared.bus import Bus
from shared.campaigns import CampaignNotYours
from shared.denials import PermissionDenied
from shared.events import EvalRequested, RequestContext, Stage, TaskSpec
from shared.settings import Settings
from shared.subjects import msg_id
from tests.integration.conftest import write_workspace
from tests.integration.secured_nats import SecuredServer

CAMPAIGN = "agents-search"
TASK = TaskSpec(base_model="tiny-standin", benchmark="tiny-arith", description="double numbers", campaign=CAMPAIGN)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SecuredServer]:
    server = SecuredServer(tmp_path_factory.mktemp("owners-nats"), agents=("agent", "rival"))
    server.start()
    yield server
    server.stop()


def _settings(server: SecuredServer, user: str, home: Path, standin_bin: Path, assets_dir: Path) -> Settings:
    return Settings(home=home / user, assets_dir=assets_dir, nats_url=server.url(user), subject_prefix="ftbus",
                    toolchain_bin=standin_bin, ack_wait_s=4.0, heartbeat_s=1.0, max_deliver=3,
                    retry_backoff_s=[0.2, 0.5], sweep_interval_s=1.0, log_format="console", log_level="WARNING")


async def test_each_identity_submits_as_itself_and_keeps_out_of_the_others_campaign(
        secured: SecuredServer, standin_bin: Path, assets_dir: Path, tmp_path: Path) -> None:
    admin = await Bus.connect(_settings(secured, "admin", tmp_path, standin_bin, assets_dir), name="ftbus-up")
    await admin.ensure_topology()
    stop = asyncio.Event()
    services = asyncio.create_task(run_services(admin, list(Stage), None, stop))
    await asyncio.sleep(0.5)  # the durable consumers exist (as tests/integration/test_permissions.py waits)
    try:
        agent_settings = _settings(secured, "agent", tmp_path, standin_bin, assets_dir)
        rival_settings = _settings(secured, "rival", tmp_path, standin_bin, assets_dir)
        assert (agent_settings.submit_owner(), rival_settings.submit_owner()) == ("agent", "rival")
        async with Client(settings=agent_settings) as agent, Client(settings=rival_settings) as rival:
            # `agent` opens the campaign: the stand-in candidate beats the base model on validation.
            first = await agent.submit(write_workspace(tmp_path / "first"), TASK)
            verdict = await agent.wait(first, timeout_s=120)
            assert verdict.status == "completed", verdict.execution
            record = await agent.campaign(CAMPAIGN)
            assert record is not None and record.owner == "agent" and [e.request_id for e in record.history] == [first]
            # Its budget is its own: the bench stage decided under its name (tests/integration/
            # test_decision_pipeline.py shows a budget spent and recorded).
            assert verdict.result.decision is not None and verdict.result.decision.owner == "agent"

            # `rival` into agent's campaign: the client says so before uploading anything.
            with pytest.raises(CampaignNotYours, match="campaign agents-search belongs to agent"):
                await rival.submit(write_workspace(tmp_path / "rival"), TASK)
            # Around the client, on its own subject: the judge refuses it and writes nothing into the campaign.
            sneaky = "20261207-120000-5ea4c0de"
            store = await rival.bus.submitter_artifacts()
            files = await upload_dir(store, f"{sneaky}/workspace", write_workspace(tmp_path / "sneaky"),
                                     max_bytes=rival_settings.max_workspace_bytes,
                                     max_files=rival_settings.max_workspace_files)
            event = EvalRequested(request_id=sneaky, context=RequestContext(task=TASK, workspace=files, owner="agent"))
            await rival.bus.publish(rival.bus.subjects.eval_requested_by("rival"), event,
                                    msg_id(sneaky, "submit", "requested"))
            refused = await rival.wait(sneaky, timeout_s=120)
            assert refused.status == "completed" and refused.final_decision is False, refused.execution
            check = refused.result.campaign
            assert check is not None and check.summary.startswith(
                "refused: campaign agents-search belongs to agent, and this request was submitted as rival"), check
            # Its owner is the subject's, not the "agent" it wrote into its request.
            assert refused.result.decision is not None and refused.result.decision.owner == "rival"
            record = await agent.campaign(CAMPAIGN)
            assert record is not None and [e.request_id for e in record.history] == [first]
            # Submitting as another identity, or as nobody, is refused by the server itself.
            for subject in (rival.bus.subjects.eval_requested_by("agent"), rival.bus.subjects.eval_requested):
                with pytest.raises(PermissionDenied) as denied:
                    await rival.bus.guard(rival.bus.publish(subject, event, msg_id(sneaky, "submit", "again")))
                assert denied.value.subject == subject
            # No agent reads or writes an owner's budget.
            for client in (agent, rival):
                with pytest.raises(PermissionDenied):
                    await client.bus.guard((await client.bus.kv(client.bus.subjects.kv_owners)).get("agent"))
    finally:
        stop.set()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(services, timeout=15)
        await admin.close()
