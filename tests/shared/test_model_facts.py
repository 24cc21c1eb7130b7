"""A model's facts (context length, capabilities) are cached per name, and read again once older
than their TTL: a model re-pulled under its name is seen without a restart, and never on the path of
the call that notices (the cached facts answer while they are read again)."""

from __future__ import annotations

from dataclasses import replace

from ollama_sim import OllamaSimulator
from palimpsest.shared.ollama import OllamaClient
from tests.helpers.waiting import until


async def test_a_repulled_model_is_seen_after_the_ttl_without_a_restart():
    with OllamaSimulator() as sim:
        client = OllamaClient(sim.url, facts_ttl_s=0.0)
        try:
            first = await client.model_facts("tiny")
            assert first.context_length == sim.models["tiny"].context_length and not first.vision
            sim.models["tiny"] = replace(
                sim.models["tiny"], context_length=4_096, capabilities=(*sim.models["tiny"].capabilities, "vision")
            )
            assert await client.model_facts("tiny") == first  # answered from the cache, read again behind it

            async def fresh() -> bool:
                facts = await client.model_facts("tiny")
                return facts.context_length == 4_096 and facts.vision

            assert await until(fresh)
        finally:
            await client.aclose()


async def test_facts_that_cannot_be_read_again_stay_as_they_were():
    with OllamaSimulator() as sim:
        client = OllamaClient(sim.url, facts_ttl_s=0.0)
        try:
            first = await client.model_facts("tiny")
            shows = len(sim.bodies("/api/show"))
            del sim.models["tiny"]  # removed: /api/show answers 404 from now on
            assert await client.model_facts("tiny") == first
            assert await until(lambda: len(sim.bodies("/api/show")) > shows)
            assert await client.model_facts("tiny") == first
        finally:
            await client.aclose()


async def test_within_the_ttl_the_facts_are_not_read_again():
    with OllamaSimulator() as sim:
        client = OllamaClient(sim.url)
        try:
            await client.model_facts("tiny")
            shows = len(sim.bodies("/api/show"))
            for _ in range(5):
                await client.model_facts("tiny")
            assert len(sim.bodies("/api/show")) == shows
        finally:
            await client.aclose()
