"""With auth on, what the services learn about a model (reports, baselines, token counts) is written
under their own identity only: no signed-in user can bend another user's counts. Every Compressor
RPC needs credentials."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace

import grpc
import pytest

from palimpsest.shared.auth import service_metadata
from palimpsest.v1 import common_pb2, compressor_pb2_grpc
from palimpsest.v1 import compressor_pb2 as cpb
from palimpsest.v1 import session_store_pb2 as pb
from tests.conftest import JWT_SECRET, bearer

SERVICE = service_metadata(True, JWT_SECRET)


@pytest.fixture(scope="module")
async def compressor_auth_server(base_settings, store_server_auth, ollama_sim):
    from palimpsest.compressor.app import start_compressor

    settings = replace(
        base_settings, auth_enabled=True, ollama_host=ollama_sim.url, store_addr=store_server_auth.address
    )
    running = await start_compressor(settings, port=0)
    yield running
    await running.stop(0)


@pytest.fixture(scope="module")
async def compressor_auth(compressor_auth_server):
    async with grpc.aio.insecure_channel(compressor_auth_server.address) as channel:
        yield compressor_pb2_grpc.CompressorStub(channel)


async def denied(call, code=grpc.StatusCode.PERMISSION_DENIED) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call
    assert error.value.code() == code, error.value.details()


async def alices_session(store_auth, alice) -> str:
    session = (await store_auth.CreateSession(pb.CreateSessionRequest(profile_id="p"), metadata=alice)).session
    await store_auth.AppendMessages(
        pb.AppendMessagesRequest(session_id=session.id, messages=[common_pb2.Message(role="user", content="hello")]),
        metadata=alice,
    )
    return session.id


async def test_a_user_cannot_write_calibration_baselines_or_counts(store_auth, user):
    alice, bob = bearer(user), bearer(f"{user}-bob")
    model = f"poison-{uuid.uuid4().hex[:6]}"
    session_id = await alices_session(store_auth, alice)
    lie = pb.Observation(model=model, chars=1000, tokens=7000)
    await denied(store_auth.RecordObservation(pb.RecordObservationRequest(observation=lie), metadata=bob))
    await denied(
        store_auth.SetBaseline(
            pb.SetBaselineRequest(session_id=session_id, baseline=pb.Baseline(tokens=9999, through_seq=1)),
            metadata=alice,
        )
    )
    await denied(
        store_auth.SetTokenCounts(
            pb.SetTokenCountsRequest(
                session_id=session_id, token_digest="d", counts=[common_pb2.TokenCount(seq=1, tokens=1)]
            ),
            metadata=alice,
        )
    )
    listed = await store_auth.ListObservations(pb.ListObservationsRequest(model=model), metadata=SERVICE)
    assert not listed.observations
    await store_auth.RecordObservation(pb.RecordObservationRequest(observation=lie), metadata=SERVICE)
    assert (
        len((await store_auth.ListObservations(pb.ListObservationsRequest(model=model), metadata=SERVICE)).observations)
        == 1
    )


async def test_only_the_services_and_admins_read_every_users_prompt_sizes(store_auth, user):
    """A model's calibration observations are every tenant's prompt sizes and character mixes: a
    user reads none of them, by ListObservations or through GetBaseline's `model`, even on their
    own session; the services (and their vouch beside a user's credentials) and admins do."""
    from palimpsest.shared.auth import vouching_metadata

    alice = bearer(user)
    model = f"sizes-{uuid.uuid4().hex[:6]}"
    session_id = await alices_session(store_auth, alice)
    await store_auth.RecordObservation(
        pb.RecordObservationRequest(observation=pb.Observation(model=model, chars=1234, tokens=400)), metadata=SERVICE
    )
    await denied(store_auth.ListObservations(pb.ListObservationsRequest(model=model), metadata=alice))
    await denied(store_auth.GetBaseline(pb.GetBaselineRequest(session_id=session_id, model=model), metadata=alice))
    assert not (
        await store_auth.GetBaseline(pb.GetBaselineRequest(session_id=session_id), metadata=alice)
    ).observations  # the baseline alone stays hers
    for reader in (SERVICE, bearer(f"{user}-admin", role="admin"), alice + vouching_metadata(True, JWT_SECRET)):
        assert [
            o.chars
            for o in (
                await store_auth.GetBaseline(pb.GetBaselineRequest(session_id=session_id, model=model), metadata=reader)
            ).observations
        ] == [1234]
    for reader in (SERVICE, bearer(f"{user}-admin", role="admin")):
        assert [
            o.chars
            for o in (
                await store_auth.ListObservations(pb.ListObservationsRequest(model=model), metadata=reader)
            ).observations
        ] == [1234]


async def test_only_the_services_report_to_the_compressor(compressor_auth, store_auth, user):
    alice = bearer(user)
    session_id = await alices_session(store_auth, alice)
    report = cpb.RecordBaselineRequest(
        session_id=session_id, model="qwen3.6", prompt_eval_count=900, sent_tokens=900, through_seq=1, window=8192
    )
    await denied(compressor_auth.RecordBaseline(report, metadata=alice))
    baseline = await store_auth.GetBaseline(pb.GetBaselineRequest(session_id=session_id), metadata=alice)
    assert not baseline.HasField("baseline")
    assert (await compressor_auth.RecordBaseline(report, metadata=SERVICE)).recorded
    baseline = await store_auth.GetBaseline(pb.GetBaselineRequest(session_id=session_id), metadata=alice)
    assert baseline.baseline.tokens == 900


async def test_every_compressor_rpc_needs_credentials(compressor_auth):
    message = [common_pb2.Message(role="user", content="hi")]
    for call in (
        compressor_auth.EstimateTokens(cpb.EstimateTokensRequest(model="qwen3.6", messages=message)),
        compressor_auth.CheckContextSize(cpb.CheckContextSizeRequest(model="qwen3.6", messages=message)),
    ):
        await denied(call, grpc.StatusCode.UNAUTHENTICATED)


async def test_a_turn_with_auth_on_still_teaches_the_model(
    base_settings, store_server_auth, store_auth, ollama_sim, profiles_file, user, tmp_path
):
    from ollama_sim import Reply
    from palimpsest.agent.app import start_agent
    from palimpsest.compressor.app import start_compressor
    from palimpsest.v1 import agent_pb2 as apb
    from palimpsest.v1 import agent_pb2_grpc

    alice = bearer(user)
    settings = replace(
        base_settings,
        auth_enabled=True,
        ollama_host=ollama_sim.url,
        store_addr=store_server_auth.address,
        profiles_path=profiles_file,
    )
    compressor = await start_compressor(settings, port=0)
    agent = await start_agent(replace(settings, compressor_addr=compressor.address), port=0)
    try:
        async with grpc.aio.insecure_channel(agent.address) as channel:
            ollama_sim.script(Reply(text="hello alice"))
            events = [
                e
                async for e in agent_pb2_grpc.AgentStub(channel).RunStream(
                    apb.RunStreamRequest(text="hi"), metadata=alice
                )
            ]
    finally:
        await agent.stop(0)
        await compressor.stop(0)
    assert events[-1].stream_end.reason == apb.STREAM_END_REASON_COMPLETED
    baseline = await store_auth.GetBaseline(pb.GetBaselineRequest(session_id=events[0].session_id), metadata=alice)
    assert baseline.baseline.tokens > 0  # recorded under the services' identity, readable by its owner


async def test_stop_tells_another_user_nothing(
    base_settings, store_server_auth, store_auth, ollama_sim, profiles_file, user
):
    from palimpsest.agent.app import start_agent
    from palimpsest.v1 import agent_pb2 as apb
    from palimpsest.v1 import agent_pb2_grpc

    alice, bob = bearer(user), bearer(f"{user}-bob")
    session_id = await alices_session(store_auth, alice)
    settings = replace(
        base_settings,
        auth_enabled=True,
        ollama_host=ollama_sim.url,
        store_addr=store_server_auth.address,
        profiles_path=profiles_file,
    )
    agent = await start_agent(settings, port=0)
    try:
        async with grpc.aio.insecure_channel(agent.address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            await denied(stub.Stop(apb.StopRequest(session_id=session_id), metadata=bob))
            assert not (await stub.Stop(apb.StopRequest(session_id=session_id), metadata=alice)).stopped
    finally:
        await agent.stop(0)


async def test_a_report_no_template_could_produce_is_refused_and_learned_from_nothing(
    compressor_auth, store_auth, user
):
    """Even from a service: a count far above what any chat template adds to the exact content
    (bob's attack, from a broken or compromised reporter) is refused and changes nothing."""
    model = f"qwen3.6-ceiling-{uuid.uuid4().hex[:6]}"
    shape = common_pb2.PromptShape(content_tokens=3000, messages=6)
    lie = cpb.RecordBaselineRequest(
        model=model,
        prompt_eval_count=3000 + 9000,
        sent_tokens=3100,
        window=32768,
        shape=shape,
        method=cpb.ESTIMATE_METHOD_EXACT,
    )
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await compressor_auth.RecordBaseline(lie, metadata=SERVICE)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "prompt_eval_count" in refused.value.details()
    listed = await store_auth.ListObservations(pb.ListObservationsRequest(model=model), metadata=SERVICE)
    assert not listed.observations
    # A long Modelfile system prompt is not a lie: 2,000 tokens over the content is learned.
    honest = cpb.RecordBaselineRequest(
        model=model,
        prompt_eval_count=3000 + 2000,
        sent_tokens=3100,
        window=32768,
        shape=shape,
        method=cpb.ESTIMATE_METHOD_EXACT,
    )
    assert (await compressor_auth.RecordBaseline(honest, metadata=SERVICE)).recorded


async def test_a_size_check_on_someone_elses_session_cannot_bend_its_stored_counts(
    compressor_auth, compressor_auth_server, store_auth, user
):
    """Bob sends Alice's session id with his own text for her rows: the counts a size check makes
    are stored only on rows whose content they were made from, so hers stay as they are."""
    alice, bob = bearer(user), bearer(f"{user}-bob")
    session_id = await alices_session(store_auth, alice)
    await compressor_auth.CheckContextSize(
        cpb.CheckContextSizeRequest(
            model="qwen3.6",
            session_id=session_id,
            window=8192,
            messages=[common_pb2.Message(role="user", content="x " * 50, seq=1)],
        ),
        metadata=bob,
    )
    # The next report of that session writes what the size check counted.
    await compressor_auth.RecordBaseline(
        cpb.RecordBaselineRequest(
            session_id=session_id, model="qwen3.6", prompt_eval_count=20, through_seq=1, window=8192
        ),
        metadata=SERVICE,
    )
    await asyncio.gather(*compressor_auth_server.servicer._writes)
    digest = (await compressor_auth_server.servicer.tokenizers.counter("qwen3.6")).digest
    stored = await store_auth.GetBaseline(
        pb.GetBaselineRequest(session_id=session_id, token_digest=digest), metadata=alice
    )
    assert stored.context_tokens.counted_messages == 0  # Bob's count was not kept on her row
    assert [m.content for m in stored.context_tokens.uncounted] == ["hello"]


async def test_a_calibrated_report_keeps_its_characters_by_class(compressor_auth, store_auth, user):
    """The shape a calibrated report brings back (no exact content count, its characters by class)
    is stored and listed, or no per-class rates could ever be fitted from the live reports."""
    model = f"no-vocabulary-{uuid.uuid4().hex[:6]}"
    shape = common_pb2.PromptShape(messages=4, chars_space=120, chars_digit=300, chars_latin=900, chars_symbol=80)
    for tokens in (700, 710, 720):
        await compressor_auth.RecordBaseline(
            cpb.RecordBaselineRequest(
                model=model,
                prompt_eval_count=tokens,
                sent_tokens=tokens,
                sent_chars=1400,
                window=8192,
                shape=shape,
                method=cpb.ESTIMATE_METHOD_CALIBRATED,
            ),
            metadata=SERVICE,
        )
    listed = await store_auth.ListObservations(pb.ListObservationsRequest(model=model), metadata=SERVICE)
    assert [o.exact.chars_digit for o in listed.observations] == [300, 300, 300]
    assert all(o.chars == 1400 and o.exact.content_tokens == 0 for o in listed.observations)


async def test_the_size_check_prices_by_class_once_reports_have_shapes(compressor_auth, user):
    """A model without a vocabulary: after a few reports the count follows each class's price
    (here a hidden price that makes CJK five times dearer than Latin), not one chars rate."""
    from palimpsest.compressor.calibration import char_classes

    model = f"no-vocabulary-{uuid.uuid4().hex[:6]}"
    hidden = (0.3, 1.0, 0.25, 1.6, 1.0, 0.5)  # space, digit, latin, cjk, other letters, symbols

    def price(messages: int, classes) -> int:
        return round(30 + 5 * messages + sum(r * c for r, c in zip(hidden, classes)))

    texts = [
        "The deploy finished; every worker took its lease. " * k + "计费服务迁移到新集群。" * j + "id=0x1f2e " * i
        for k, j, i in ((20, 1, 3), (5, 8, 10), (12, 3, 1), (2, 15, 6), (30, 0, 12), (8, 6, 0))
    ]
    for text in texts:
        classes = char_classes(text)
        shape = common_pb2.PromptShape(
            messages=1,
            **{f"chars_{n}": c for n, c in zip(("space", "digit", "latin", "cjk", "other_letter", "symbol"), classes)},
        )
        await compressor_auth.RecordBaseline(
            cpb.RecordBaselineRequest(
                model=model,
                prompt_eval_count=price(1, classes),
                sent_tokens=1,
                sent_chars=len(text),
                window=32768,
                shape=shape,
                method=cpb.ESTIMATE_METHOD_CALIBRATED,
            ),
            metadata=SERVICE,
        )
    probe = "计费服务迁移到新集群后，错误预算恢复前保留旧路径。" * 30
    reply = await compressor_auth.EstimateTokens(
        cpb.EstimateTokensRequest(model=model, messages=[common_pb2.Message(role="user", content=probe)]),
        metadata=bearer(user),
    )
    real = price(1, char_classes(probe))
    assert reply.method == cpb.ESTIMATE_METHOD_CALIBRATED
    assert abs(reply.tokens - real) / real < 0.05, (reply.tokens, real)


async def test_a_report_rides_on_an_append_only_when_the_services_vouch_for_it(store_auth, user):
    """The Agent folds a call's report into the append of its answer, with the user's credentials
    (the user's access is what is checked) and the services' vouch beside them: a user alone
    cannot slip a baseline or an observation in, and the refused append stores nothing."""
    from palimpsest.shared.auth import vouching_metadata

    alice = bearer(user)
    model = f"vouch-{uuid.uuid4().hex[:6]}"
    session_id = await alices_session(store_auth, alice)
    report = pb.ModelReport(
        baseline=pb.Baseline(tokens=4321, through_seq=1, model=model),
        observation=pb.Observation(model=model, chars=1000, tokens=7000),
        context_token_count=4321,
    )
    answer = [common_pb2.Message(role="assistant", content="hi")]
    await denied(
        store_auth.AppendMessages(
            pb.AppendMessagesRequest(session_id=session_id, messages=answer, report=report), metadata=alice
        )
    )
    forged = alice + (("x-palimpsest-service", "not-a-token"),)
    await denied(
        store_auth.AppendMessages(
            pb.AppendMessagesRequest(session_id=session_id, messages=answer, report=report), metadata=forged
        )
    )
    assert (
        await store_auth.GetSession(pb.GetSessionRequest(session_id=session_id), metadata=alice)
    ).session.display_message_count == 1  # refused whole: the answer is not stored either
    stored = await store_auth.AppendMessages(
        pb.AppendMessagesRequest(session_id=session_id, messages=answer, report=report),
        metadata=alice + vouching_metadata(True, JWT_SECRET),
    )
    assert len(stored.seqs) == 1 and not stored.context_truncated
    baseline = (await store_auth.GetBaseline(pb.GetBaselineRequest(session_id=session_id), metadata=SERVICE)).baseline
    assert (baseline.tokens, baseline.through_seq, baseline.model) == (4321, 1, model)
    assert (
        len((await store_auth.ListObservations(pb.ListObservationsRequest(model=model), metadata=SERVICE)).observations)
        == 1
    )
    session = (await store_auth.GetSession(pb.GetSessionRequest(session_id=session_id), metadata=alice)).session
    assert session.context_token_count == 4321
    # A report that proves a cut flags the session, and the append says so.
    cut = await store_auth.AppendMessages(
        pb.AppendMessagesRequest(session_id=session_id, messages=answer, report=pb.ModelReport(prompt_cut=True)),
        metadata=alice + vouching_metadata(True, JWT_SECRET),
    )
    assert cut.context_truncated
    # The user's own access still decides: bob's vouched append to alice's session is refused.
    await denied(
        store_auth.AppendMessages(
            pb.AppendMessagesRequest(session_id=session_id, messages=answer),
            metadata=bearer(f"{user}-bob") + vouching_metadata(True, JWT_SECRET),
        )
    )


async def test_a_report_with_bad_fields_is_refused_naming_them(store_auth, user):
    from palimpsest.shared.auth import vouching_metadata

    alice = bearer(user) + vouching_metadata(True, JWT_SECRET)
    session_id = await alices_session(store_auth, bearer(user))
    answer = [common_pb2.Message(role="assistant", content="hi")]
    for report, field in [
        (pb.ModelReport(context_token_count=-1), "report.context_token_count"),
        (pb.ModelReport(baseline=pb.Baseline(tokens=-5)), "report.baseline"),
        (pb.ModelReport(observation=pb.Observation(tokens=5)), "report.observation.model"),
        (pb.ModelReport(token_counts=[common_pb2.TokenCount(seq=1, tokens=1)]), "report.token_digest"),
        (
            pb.ModelReport(token_digest="d", token_counts=[common_pb2.TokenCount(seq=1, tokens=1)]),
            "report.token_counts",
        ),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await store_auth.AppendMessages(
                pb.AppendMessagesRequest(session_id=session_id, messages=answer, report=report), metadata=alice
            )
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in error.value.details()
    assert (
        await store_auth.GetSession(pb.GetSessionRequest(session_id=session_id), metadata=bearer(user))
    ).session.display_message_count == 1
