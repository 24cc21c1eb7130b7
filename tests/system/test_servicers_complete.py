"""Every RPC of each service is answered by its servicer, not the generated base's UNIMPLEMENTED: the
SessionStore's servicer is joined from the classes in palimpsest/store/rpcs/, and a part left out of
the join would only show as UNIMPLEMENTED at run time."""

import pytest

from palimpsest.agent.servicer import AgentServicer
from palimpsest.compressor.servicer import CompressorServicer
from palimpsest.store.servicer import SessionStoreServicer
from palimpsest.v1 import agent_pb2, agent_pb2_grpc, compressor_pb2, compressor_pb2_grpc, session_store_pb2_grpc
from palimpsest.v1 import session_store_pb2 as store_pb

SERVICES = [
    (
        store_pb.DESCRIPTOR.services_by_name["SessionStore"],
        SessionStoreServicer,
        session_store_pb2_grpc.SessionStoreServicer,
    ),
    (
        compressor_pb2.DESCRIPTOR.services_by_name["Compressor"],
        CompressorServicer,
        compressor_pb2_grpc.CompressorServicer,
    ),
    (agent_pb2.DESCRIPTOR.services_by_name["Agent"], AgentServicer, agent_pb2_grpc.AgentServicer),
]


@pytest.mark.parametrize(("service", "servicer", "generated"), SERVICES, ids=lambda s: getattr(s, "name", ""))
def test_every_rpc_is_answered_by_the_servicer(service, servicer, generated) -> None:
    unanswered = [m.name for m in service.methods if getattr(servicer, m.name) is getattr(generated, m.name)]
    assert unanswered == []


def test_the_store_parts_do_not_answer_an_rpc_twice() -> None:
    parts = [base for base in SessionStoreServicer.__mro__[1:] if base.__module__.startswith("palimpsest.store.rpcs.")]
    rpcs = {m.name for m in store_pb.DESCRIPTOR.services_by_name["SessionStore"].methods}
    answered = [name for part in parts for name in vars(part) if name in rpcs]
    assert sorted(answered) == sorted(set(answered)) and set(answered) == rpcs
