"""The real grpcurl binary against the services."""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

GRPCURL = shutil.which("grpcurl") or str(Path(sys.executable).with_name("grpcurl"))


async def grpcurl(*args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        GRPCURL, "-plaintext", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()
