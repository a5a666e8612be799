"""A durable function: a release builds, tests, then waits for an operator's approval.

The demo starts two (``console/demo.py``): 2.3.9, approved at once, runs to its end;
2.4.0 waits for the signal ``approval`` (``a`` in the Durable view sends it; any payload,
``{"by": "you"}`` say, or none). Each finished step is checkpointed: a restart resumes
after it.
"""

import asyncio

from backend import define_durable


async def build(version):
    await asyncio.sleep(0.2)
    return {"artifact": f"app-{version}.tar.gz"}


async def run_tests(artifact):
    await asyncio.sleep(0.3)
    return {"artifact": artifact, "passed": 412}


async def deploy(artifact):
    await asyncio.sleep(0.2)


async def release(ctx, input):
    built = await ctx.step("build", build, input["version"])
    await ctx.step("test", run_tests, built["artifact"])
    # No timeout: it waits as long as the execution may live, so what comes back is always
    # the signal's payload (with a timeout, None would also mean that it never came).
    approval = await ctx.wait_for("approval")
    await ctx.step("deploy", deploy, built["artifact"], at_most_once=True)
    by = approval.get("by") if isinstance(approval, dict) else None
    return {"deployed": True, "approved_by": by}


release_fn = define_durable(name="release", handler=release, description="Builds, tests and deploys a version")
