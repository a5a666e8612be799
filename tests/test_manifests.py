"""Platform manifests: every provider's output is parsed and checked field by field."""

from __future__ import annotations

import json
import re
import shlex
import urllib.error
import urllib.request
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
import yaml

from backend.cron import Cron
from backend.errors import BadInput
from backend.scheduler.manifests import PROVIDERS, ManifestFile, render_manifests
from backend.schedules import Schedule, define_schedule

BASE = "https://sched.example.com"
PLATFORMS = ("kubernetes", "aws", "gcp", "azure")
CANARY = "canary-token-never-inline-4711"

K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
K8S_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
AWS_NAME = re.compile(r"[0-9a-zA-Z_.-]{1,64}")
GCP_JOB = re.compile(r"[A-Za-z0-9_-]{1,500}")
AZURE_FUNCTION = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,126}")
FILE_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*|__init__\.py")


def handler(ctx: Any) -> None:
    pass


def ext(name: str, cron: str, tz: str = "Europe/Berlin", **kwargs: Any) -> Schedule:
    kwargs.setdefault("trigger", "external")
    return define_schedule(name=name, cron=cron, timezone=tz, handler=handler, **kwargs)


def by_path(files: list[ManifestFile]) -> dict[str, str]:
    paths = [f.path for f in files]
    assert len(paths) == len(set(paths))
    return {f.path: f.content for f in files}


def fire_url(name: str) -> str:
    return f"{BASE}/schedule/{name}/fire?trigger=external"


# -- extracting each platform's schedules ---------------------------------------------------


def k8s_docs(files: list[ManifestFile]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for f in files:
        assert f.path.endswith(".cronjob.yaml")
        docs.extend(d for d in yaml.safe_load_all(f.content) if d is not None)
    return docs


def aws_templates(files: list[ManifestFile]) -> list[dict[str, Any]]:
    assert all(f.path.endswith(".cloudformation.json") for f in files)
    return [json.loads(f.content) for f in files]


def aws_schedules(template: dict[str, Any]) -> list[dict[str, Any]]:
    return [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::Scheduler::Schedule"]


def gcloud_commands(script: str) -> list[list[str]]:
    """Each `gcloud scheduler jobs create` command of a script, split as the shell would."""
    joined = script.replace("\\\n", " ")
    return [shlex.split(line) for line in joined.splitlines() if line.startswith("gcloud scheduler jobs create")]


def flags(argv: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for arg in argv:
        if arg.startswith("--"):
            key, _, value = arg[2:].partition("=")
            assert key not in out, f"flag --{key} given twice"
            out[key] = value
    return out


def azure_functions(files: list[ManifestFile]) -> dict[str, dict[str, Any]]:
    """function folder path -> parsed function.json."""
    return {
        f.path.rsplit("/", 1)[0]: json.loads(f.content) for f in files if f.path.endswith("/function.json")
    }


def platform_crons(provider: str, files: list[ManifestFile]) -> list[str]:
    """The cron expressions the platform will run, in its own dialect."""
    if provider == "kubernetes":
        return [d["spec"]["schedule"] for d in k8s_docs(files)]
    if provider == "aws":
        return [s["ScheduleExpression"] for t in aws_templates(files) for s in aws_schedules(t)]
    if provider == "gcp":
        return [flags(cmd)["schedule"] for f in files for cmd in gcloud_commands(f.content)]
    return [fn["bindings"][0]["schedule"] for fn in azure_functions(files).values()]


# -- an independent reading of the emitted dialects -------------------------------------------


def expand(text: str, low: int, high: int) -> set[int]:
    assert re.fullmatch(r"[0-9*,/-]+", text), f"not numeric: {text!r}"
    out: set[int] = set()
    for item in text.split(","):
        base, slash, step_text = item.partition("/")
        step = int(step_text) if slash else 1
        if base == "*":
            a, b = low, high
        elif "-" in base:
            a, b = (int(x) for x in base.split("-"))
        else:
            a = int(base)
            b = high if slash else a
        assert low <= a <= b <= high, f"{item!r} outside {low}-{high}"
        out |= set(range(a, b + 1, step))
    return out


def platform_slots(provider: str, expr: str, start: date, days: int) -> set[datetime]:
    """The UTC slots a platform expression fires on over ``days`` days from ``start``."""
    if provider == "aws":
        m = re.fullmatch(r"cron\((.*)\)", expr)
        assert m, expr
        minute, hour, dom, month, dow, year = m[1].split(" ")
        assert year == "*"
        assert (dom == "?") != (dow == "?"), f"AWS needs exactly one '?': {expr}"
        weekdays = {0, 1, 2, 3, 4, 5, 6} if dow == "?" else {v - 1 for v in expand(dow, 1, 7)}
        assert "/" not in dow, "AWS day-of-week takes no increments"
        doms = set(range(1, 32)) if dom == "?" else expand(dom, 1, 31)
    else:
        fields = expr.split(" ")
        if provider == "azure":
            assert len(fields) == 6 and fields[0] == "0", expr
            fields = fields[1:]
        assert len(fields) == 5, expr
        minute, hour, dom, month, dow = fields
        assert dom == "*" or dow == "*", f"both day fields restricted: {expr}"
        doms = expand(dom, 1, 31)
        weekdays = expand(dow, 0, 6)  # robfig/cron, NCRONTAB: Sunday is 0 and 7 is invalid
    minutes, hours, months = expand(minute, 0, 59), expand(hour, 0, 23), expand(month, 1, 12)
    slots: set[datetime] = set()
    for i in range(days):
        d = start + timedelta(days=i)
        if d.month in months and d.day in doms and (d.weekday() + 1) % 7 in weekdays:
            for h in hours:
                for mi in minutes:
                    slots.add(datetime(d.year, d.month, d.day, h, mi, tzinfo=UTC))
    return slots


SEMANTIC_CASES = [
    "0 9 * * 1-5",
    "0 0 1 * *",
    "30 2 * * 0",
    "0 12 * * SUN",
    "*/15 * * * *",
    "0 0 * * 7",
    "0 0 * * 0,7",
    "0 6 * * */2",
    "0 6 * * 1-5/2",
    "0 6 * * 1/2",
    "0 6 * * 5-7",
    "0 22 * * fri-sat,sun",
    "0 0 */2 * *",
    "5/20 * * * *",
    "0 0 1 jan,jul *",
    "0 0 1 */3 *",
    "15 3 1-7 * *",
    "0 8-18/2 * * mon-fri",
    "0 9 1,15 * 1",
    "0 0 31 2,4 1",
    "0 0 1-31 * 1",
    "0 0 */1 * 1",
    "@weekly",
    "@hourly",
]


@pytest.mark.parametrize("provider", PLATFORMS)
@pytest.mark.parametrize("expr", SEMANTIC_CASES)
def test_platform_crons_fire_exactly_when_schedtui_does(provider: str, expr: str) -> None:
    schedule = ext("job", expr, tz="UTC")
    crons = platform_crons(provider, render_manifests([schedule], provider, BASE))
    assert 1 <= len(crons) <= 2
    start, days = date(2026, 1, 1), 120
    got: set[datetime] = set()
    for cron in crons:
        got |= platform_slots(provider, cron, start, days)
    begin = datetime(2026, 1, 1, tzinfo=UTC)
    want = set(Cron(expr, "UTC").occurrences(begin - timedelta(seconds=1), begin + timedelta(days=days, seconds=-1)))
    assert want
    assert got == want


# -- common checks ------------------------------------------------------------------------------


def test_unknown_provider_lists_the_valid_ones() -> None:
    with pytest.raises(BadInput) as info:
        render_manifests([ext("a", "0 9 * * *")], "heroku", BASE)
    assert "heroku" in str(info.value)
    for provider in PROVIDERS:
        assert provider in str(info.value)
    assert info.value.field == "provider"
    assert PROVIDERS == ("kubernetes", "aws", "gcp", "azure", "generic")


@pytest.mark.parametrize(
    "url",
    [
        "",
        "sched.example.com",
        "ftp://sched.example.com",
        "https://",
        "https:///path",
        "https://user:pw@sched.example.com",
        "https://sched.example.com/?x=1",
        "https://sched.example.com/#top",
        "https://sched example.com",
        "https://sched.example.com/a b",
        "https://sched.example.com:99999",
        "https://sched.example.com//",
        "https://sched.example.com/a//b",
        " https://sched.example.com",
    ],
)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_bad_base_url(url: str, provider: str) -> None:
    with pytest.raises(BadInput) as info:
        render_manifests([ext("a", "0 9 * * *")], provider, url)
    assert info.value.field == "base_url"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://sched.example.com/", "https://sched.example.com"),
        ("HTTPS://sched.example.com:8443/api/", "https://sched.example.com:8443/api"),
        ("http://schedtui.ops.svc.cluster.local:8080", "http://schedtui.ops.svc.cluster.local:8080"),
        ("http://[::1]:8080/", "http://[::1]:8080"),
    ],
)
def test_base_url_accepted_and_normalised(url: str, expected: str) -> None:
    (readme,) = render_manifests([ext("a", "0 9 * * *")], "generic", url)
    assert f"`{expected}/schedule/a/fire?trigger=external`" in readme.content


def test_aws_needs_https() -> None:
    with pytest.raises(BadInput, match="https"):
        render_manifests([ext("a", "0 9 * * *")], "aws", "http://sched.example.com")


@pytest.mark.parametrize("provider", PROVIDERS)
def test_six_field_external_schedule_fails_the_whole_call(provider: str) -> None:
    # define_schedule refuses external + seconds; a Schedule built directly must be caught too.
    fast = Schedule(name="every-30s", cron=Cron("*/30 * * * * *", "UTC"), handler=handler, trigger="external")
    faster = Schedule(name="every-10s", cron=Cron("*/10 * * * * *", "UTC"), handler=handler, trigger="external")
    fine = ext("daily", "0 9 * * *")
    with pytest.raises(BadInput) as info:
        render_manifests([fine, fast, faster], provider, BASE)
    message = str(info.value)
    assert '"every-30s"' in message and '"every-10s"' in message
    assert "*/30 * * * * *" in message and "seconds" in message
    assert "daily" not in message


def test_six_field_self_schedule_is_simply_left_out() -> None:
    fast = ext("every-30s", "*/30 * * * * *", trigger="self")
    assert render_manifests([fast, ext("daily", "0 9 * * *")], "kubernetes", BASE)[0].path == "daily.cronjob.yaml"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_self_and_default_trigger_schedules_are_ignored(provider: str) -> None:
    own = [ext("mine", "0 9 * * *", trigger="self"), ext("default", "0 9 * * *", trigger=None)]
    assert render_manifests(own, provider, BASE) == []
    assert render_manifests([], provider, BASE) == []
    files = render_manifests([*own, ext("theirs", "0 9 * * *")], provider, BASE)
    text = "\n".join(f.content for f in files)
    assert "theirs" in text and "mine" not in text and "/default/" not in text


@pytest.mark.parametrize("provider", PLATFORMS)
def test_both_days_required_cannot_be_expressed(provider: str) -> None:
    odd_mondays = ext("odd-mondays", "0 0 */2 * 1")
    with pytest.raises(BadInput) as info:
        render_manifests([ext("fine", "0 9 * * *"), odd_mondays], provider, BASE)
    message = str(info.value)
    assert '"odd-mondays"' in message and "0 0 */2 * 1" in message and provider in message
    assert "fine" not in message


def test_generic_lists_both_days_required_schedules() -> None:
    (readme,) = render_manifests([ext("odd-mondays", "0 0 */2 * 1")], "generic", BASE)
    assert "| `odd-mondays` | `0 0 */2 * 1` |" in readme.content


def test_duplicate_schedule_names_are_refused() -> None:
    with pytest.raises(BadInput, match="twin"):
        render_manifests([ext("twin", "0 9 * * *"), ext("twin", "0 10 * * *")], "gcp", BASE)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_token_is_never_inline(provider: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDTUI_TOKEN", CANARY)
    files = render_manifests([ext("a", "0 9 * * *"), ext("b", "0 9 1,15 * 1")], provider, BASE)
    assert files
    for f in files:
        assert CANARY not in f.content
        assert not re.search(r"Bearer [A-Za-z0-9_.~+/-]{8,}", f.content), f.path


@pytest.mark.parametrize("provider", PROVIDERS)
def test_output_is_deterministic_and_sorted(provider: str) -> None:
    schedules = [ext("zeta", "0 9 * * *"), ext("Alpha", "0 9 1,15 * 1", tz="UTC"), ext("mid", "*/5 * * * *")]
    first = render_manifests(schedules, provider, BASE)
    assert first == render_manifests(list(reversed(schedules)), provider, BASE)


ODD_NAMES = [
    "Weird_Name.v2",
    "..",
    ".hidden",
    "-dash-first",
    "UPPER",
    "upper",
    "a" * 128,
    "a" * 127 + "b",
    "x." + "Y_" * 63,
    "9lives",
]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_odd_names_give_valid_unique_platform_names_and_paths(provider: str) -> None:
    schedules = [ext(name, "0 9 * * *") for name in ODD_NAMES] + [ext("split-" + "s" * 100, "0 9 1 * 1")]
    files = render_manifests(schedules, provider, BASE)
    for f in files:
        parts = f.path.split("/")
        assert all(FILE_PART.fullmatch(p) and p not in (".", "..") for p in parts), f.path
        assert len(parts[-1]) <= 130
    names: list[str] = []
    connections: list[str] = []
    if provider == "kubernetes":
        for doc in k8s_docs(files):
            name = doc["metadata"]["name"]
            assert K8S_NAME.fullmatch(name) and len(name) <= 52, name
            for value in doc["metadata"]["labels"].values():
                assert K8S_LABEL_VALUE.fullmatch(value) and len(value) <= 63, value
            names.append(name)
    elif provider == "aws":
        for template in aws_templates(files):
            for resource in template["Resources"].values():
                props = resource["Properties"]
                if "Name" in props:
                    assert AWS_NAME.fullmatch(props["Name"]), props["Name"]
            names += [s["Name"] for s in aws_schedules(template)]
            connections.append(template["Resources"]["Connection"]["Properties"]["Name"])
            stack = template["Metadata"]["schedtui"]["deploy"].split("--stack-name ")[1].split(" ")[0]
            assert re.fullmatch(r"[A-Za-z][A-Za-z0-9-]{0,127}", stack), stack
    elif provider == "gcp":
        for f in files:
            for cmd in gcloud_commands(f.content):
                job = cmd[5]
                assert GCP_JOB.fullmatch(job), job
                names.append(job)
    elif provider == "azure":
        for folder in azure_functions(files):
            function = folder.split("/")[1]
            assert AZURE_FUNCTION.fullmatch(function), function
            names.append(function.lower())
    if provider != "generic":
        assert len(names) == len(set(names))
        assert len(names) >= len(schedules)
        assert len(connections) == len(set(connections))
    # The exact name still reaches the engine, percent-encoded where it must be.
    text = "\n".join(f.content for f in files)
    assert "/schedule/%2E%2E/fire" in text
    assert "/schedule/Weird_Name.v2/fire" in text


def test_valid_names_are_kept_as_they_are() -> None:
    schedule = ext("monthly-invoice", "0 9 1 * *")
    (k8s,) = render_manifests([schedule], "kubernetes", BASE)
    assert k8s.path == "monthly-invoice.cronjob.yaml"
    assert k8s_docs([k8s])[0]["metadata"]["name"] == "schedtui-monthly-invoice"
    (aws,) = render_manifests([schedule], "aws", BASE)
    assert aws_schedules(aws_templates([aws])[0])[0]["Name"] == "schedtui-monthly-invoice"
    (gcp,) = render_manifests([schedule], "gcp", BASE)
    assert gcloud_commands(gcp.content)[0][5] == "schedtui-monthly-invoice"


# -- kubernetes -----------------------------------------------------------------------------------


def test_kubernetes_cronjob() -> None:
    schedule = ext("monthly-invoice", "0 9 1 * *", description="Bill last month:\nall customers")
    (f,) = render_manifests([schedule], "kubernetes", BASE + "/")
    assert f.path == "monthly-invoice.cronjob.yaml"
    assert f.content.startswith("# ")
    (doc,) = k8s_docs([f])
    assert doc["apiVersion"] == "batch/v1" and doc["kind"] == "CronJob"
    meta = doc["metadata"]
    assert meta["name"] == "schedtui-monthly-invoice"
    labels = {"app.kubernetes.io/name": "schedtui", "schedtui/schedule": "monthly-invoice"}
    assert labels.items() <= meta["labels"].items()
    assert meta["annotations"]["schedtui/description"] == "Bill last month:\nall customers"
    assert meta["annotations"]["schedtui/schedule-name"] == "monthly-invoice"
    spec = doc["spec"]
    assert spec["schedule"] == "0 9 1 * *"
    assert spec["timeZone"] == "Europe/Berlin"
    assert spec["concurrencyPolicy"] == "Forbid"
    assert 0 < spec["startingDeadlineSeconds"] <= 600
    assert spec["successfulJobsHistoryLimit"] >= 1 and spec["failedJobsHistoryLimit"] >= 1
    job = spec["jobTemplate"]["spec"]
    assert labels.items() <= spec["jobTemplate"]["metadata"]["labels"].items()
    assert job["backoffLimit"] >= 1
    # Every attempt must reach the engine within its 10-minute tolerance.
    assert spec["startingDeadlineSeconds"] + job["activeDeadlineSeconds"] < 600
    pod = job["template"]["spec"]
    assert labels.items() <= job["template"]["metadata"]["labels"].items()
    assert pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert re.fullmatch(r"curlimages/curl:\d+\.\d+\.\d+", container["image"])
    argv = container["command"] + container["args"]
    assert argv[0] == "curl"
    assert "-fsS" in argv and "--retry-all-errors" in argv
    assert argv[argv.index("--retry") + 1] == "3"
    assert argv[argv.index("-X") + 1] == "POST"
    assert argv[argv.index("-H") + 1] == "Authorization: Bearer $(SCHEDTUI_TOKEN)"
    assert argv[-1] == fire_url("monthly-invoice")
    assert container["env"] == [
        {"name": "SCHEDTUI_TOKEN", "valueFrom": {"secretKeyRef": {"name": "schedtui-token", "key": "token"}}}
    ]
    assert "&id" not in f.content  # no YAML anchors


def test_kubernetes_without_description_has_no_description_annotation() -> None:
    (doc,) = k8s_docs(render_manifests([ext("a", "0 9 * * *")], "kubernetes", BASE))
    assert "schedtui/description" not in doc["metadata"]["annotations"]


@pytest.mark.parametrize(
    ("expr", "k8s"),
    [
        ("0 9 * * 1-5", "0 9 * * 1-5"),
        ("0 0 1 * *", "0 0 1 * *"),
        ("30 2 * * 0", "30 2 * * 0"),
        ("0 12 * * SUN", "0 12 * * 0"),
        ("*/15 * * * *", "*/15 * * * *"),
        ("0 0 * * 7", "0 0 * * 0"),  # robfig/cron (Kubernetes) has no 7 for Sunday
        ("0 8 * * mon-fri", "0 8 * * 1-5"),
        ("0 0 * * 5-7", "0 0 * * 0,5,6"),
        ("@weekly", "0 0 * * 0"),
        ("0 0 */2 * *", "0 0 */2 * *"),
        ("0 0 1 jan,jul *", "0 0 1 1,7 *"),
    ],
)
def test_kubernetes_cron_conversion(expr: str, k8s: str) -> None:
    (doc,) = k8s_docs(render_manifests([ext("a", expr)], "kubernetes", BASE))
    assert doc["spec"]["schedule"] == k8s


def test_kubernetes_either_day_is_two_cronjobs_in_one_file() -> None:
    (f,) = render_manifests([ext("paydays", "0 9 1,15 * 1")], "kubernetes", BASE)
    docs = k8s_docs([f])
    assert [d["metadata"]["name"] for d in docs] == ["schedtui-paydays-dom", "schedtui-paydays-dow"]
    assert [d["spec"]["schedule"] for d in docs] == ["0 9 1,15 * *", "0 9 * * 1"]
    assert all(d["metadata"]["labels"]["schedtui/schedule"] == "paydays" for d in docs)


# -- aws --------------------------------------------------------------------------------------------


def test_aws_template() -> None:
    schedule = ext("monthly-invoice", "0 9 1 * *", description="Bill last month")
    (f,) = render_manifests([schedule], "aws", BASE)
    assert f.path == "monthly-invoice.cloudformation.json"
    template = json.loads(f.content)
    assert template["AWSTemplateFormatVersion"] == "2010-09-09"
    res = template["Resources"]
    assert {k: v["Type"] for k, v in res.items()} == {
        "Connection": "AWS::Events::Connection",
        "ApiDestination": "AWS::Events::ApiDestination",
        "RuleRole": "AWS::IAM::Role",
        "Rule": "AWS::Events::Rule",
        "SchedulerRole": "AWS::IAM::Role",
        "Schedule": "AWS::Scheduler::Schedule",
    }
    conn = res["Connection"]["Properties"]
    assert conn["AuthorizationType"] == "API_KEY"
    assert conn["AuthParameters"] == {
        "ApiKeyAuthParameters": {
            "ApiKeyName": "Authorization",
            "ApiKeyValue": "Bearer {{resolve:secretsmanager:schedtui-token:SecretString:token}}",
        }
    }
    dest = res["ApiDestination"]["Properties"]
    assert dest["ConnectionArn"] == {"Fn::GetAtt": ["Connection", "Arn"]}
    assert dest["InvocationEndpoint"] == f"{BASE}/schedule/monthly-invoice/fire"
    assert dest["HttpMethod"] == "POST"
    rule = res["Rule"]["Properties"]
    assert rule["State"] == "ENABLED"
    assert "ScheduleExpression" not in rule  # rules are UTC-only; the Scheduler carries the zone
    pattern = rule["EventPattern"]
    (target,) = rule["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": ["ApiDestination", "Arn"]}
    assert target["RoleArn"] == {"Fn::GetAtt": ["RuleRole", "Arn"]}
    assert target["HttpParameters"] == {"QueryStringParameters": {"trigger": "external"}}
    assert target["RetryPolicy"]["MaximumRetryAttempts"] >= 1
    rule_role = res["RuleRole"]["Properties"]
    assert rule_role["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {"Service": "events.amazonaws.com"}
    assert rule_role["Policies"][0]["PolicyDocument"]["Statement"] == [
        {
            "Effect": "Allow",
            "Action": "events:InvokeApiDestination",
            "Resource": {"Fn::GetAtt": ["ApiDestination", "Arn"]},
        }
    ]
    sched = res["Schedule"]["Properties"]
    assert sched["Name"] == "schedtui-monthly-invoice"
    assert sched["GroupName"] == "default"
    assert sched["ScheduleExpression"] == "cron(0 9 1 * ? *)"
    assert sched["ScheduleExpressionTimezone"] == "Europe/Berlin"
    assert sched["FlexibleTimeWindow"] == {"Mode": "OFF"}
    assert sched["State"] == "ENABLED"
    assert sched["Description"] == "Bill last month"
    st = sched["Target"]
    assert st["RoleArn"] == {"Fn::GetAtt": ["SchedulerRole", "Arn"]}
    bus = st["Arn"]["Fn::Sub"]
    assert bus.endswith(":event-bus/default")
    sched_role = res["SchedulerRole"]["Properties"]
    trust = sched_role["AssumeRolePolicyDocument"]["Statement"][0]
    assert trust["Principal"] == {"Service": "scheduler.amazonaws.com"}
    assert sched_role["Policies"][0]["PolicyDocument"]["Statement"][0]["Action"] == "events:PutEvents"
    assert sched_role["Policies"][0]["PolicyDocument"]["Statement"][0]["Resource"] == {"Fn::Sub": bus}
    # The scheduler's event is exactly what the rule matches.
    params = st["EventBridgeParameters"]
    assert pattern == {
        "source": [params["Source"]],
        "detail-type": [params["DetailType"]],
        "detail": {"schedule": ["monthly-invoice"]},
    }
    assert json.loads(st["Input"]) == {"schedule": "monthly-invoice"}
    assert not params["Source"].startswith("aws.")
    # Both hops' retries end inside the engine's 10-minute tolerance.
    assert st["RetryPolicy"]["MaximumEventAgeInSeconds"] + target["RetryPolicy"]["MaximumEventAgeInSeconds"] <= 600
    assert template["Metadata"]["schedtui"]["url"] == fire_url("monthly-invoice")


@pytest.mark.parametrize(
    ("expr", "aws"),
    [
        ("0 9 * * 1-5", "cron(0 9 ? * 2-6 *)"),
        ("0 0 1 * *", "cron(0 0 1 * ? *)"),
        ("30 2 * * 0", "cron(30 2 ? * 1 *)"),
        ("0 12 * * SUN", "cron(0 12 ? * 1 *)"),
        ("*/15 * * * *", "cron(0/15 * * * ? *)"),
        ("0 0 * * 7", "cron(0 0 ? * 1 *)"),
        ("0 0 * * 6", "cron(0 0 ? * 7 *)"),
        ("0 0 * * 0,7", "cron(0 0 ? * 1 *)"),
        ("0 6 * * */2", "cron(0 6 ? * 1,3,5,7 *)"),
        ("0 6 * * 1-5/2", "cron(0 6 ? * 2,4,6 *)"),
        ("0 6 * * 5-7", "cron(0 6 ? * 1,6,7 *)"),
        ("0 6 * * mon,wed-fri", "cron(0 6 ? * 2,4-6 *)"),
        ("0 0 */2 * *", "cron(0 0 1/2 * ? *)"),
        ("5/20 * * * *", "cron(5/20 * * * ? *)"),
        ("0 0 1 jan,jul *", "cron(0 0 1 1,7 ? *)"),
        ("0 8-18/2 * * *", "cron(0 8,10,12,14,16,18 * * ? *)"),
        ("0 22-23/1 * * *", "cron(0 22,23 * * ? *)"),
        ("0 0 1-31 * 1", "cron(0 0 * * ? *)"),
        ("@weekly", "cron(0 0 ? * 1 *)"),
        ("@hourly", "cron(0 * * * ? *)"),
    ],
)
def test_aws_cron_conversion(expr: str, aws: str) -> None:
    (template,) = aws_templates(render_manifests([ext("a", expr)], "aws", BASE))
    (sched,) = aws_schedules(template)
    assert sched["ScheduleExpression"] == aws


def test_aws_either_day_is_two_schedules_in_one_stack() -> None:
    (template,) = aws_templates(render_manifests([ext("paydays", "0 9 1,15 * 1", tz="UTC")], "aws", BASE))
    res = template["Resources"]
    assert res["ScheduleDom"]["Properties"]["ScheduleExpression"] == "cron(0 9 1,15 * ? *)"
    assert res["ScheduleDow"]["Properties"]["ScheduleExpression"] == "cron(0 9 ? * 2 *)"
    assert res["ScheduleDom"]["Properties"]["Name"] == "schedtui-paydays-dom"
    assert res["ScheduleDow"]["Properties"]["Name"] == "schedtui-paydays-dow"
    assert "Schedule" not in res
    assert "note" in template["Metadata"]["schedtui"]


# -- gcp --------------------------------------------------------------------------------------------


def test_gcp_script() -> None:
    schedule = ext("monthly-invoice", "0 9 1 * *", description="Bill 'last' month; $(no) `expansion`")
    (f,) = render_manifests([schedule], "gcp", BASE)
    assert f.path == "monthly-invoice.gcloud.sh"
    assert f.content.startswith("#!/bin/sh\n")
    assert "\nset -eu\n" in f.content
    assert 'SCHEDTUI_TOKEN="$(gcloud secrets versions access latest --secret="$SCHEDTUI_TOKEN_SECRET")"' in f.content
    assert 'SCHEDTUI_TOKEN_SECRET="${SCHEDTUI_TOKEN_SECRET:-schedtui-token}"' in f.content
    (cmd,) = gcloud_commands(f.content)
    assert cmd[:6] == ["gcloud", "scheduler", "jobs", "create", "http", "schedtui-monthly-invoice"]
    assert [a for a in cmd[6:] if not a.startswith("--")] == []
    got = flags(cmd)
    assert got == {
        "location": "$SCHEDTUI_GCP_LOCATION",
        "schedule": "0 9 1 * *",
        "time-zone": "Europe/Berlin",
        "uri": fire_url("monthly-invoice"),
        "http-method": "POST",
        "headers": "Authorization=Bearer ${SCHEDTUI_TOKEN}",
        "attempt-deadline": "60s",
        "max-retry-attempts": "3",
        "max-retry-duration": "300s",
        "min-backoff": "10s",
        "max-backoff": "60s",
        "description": "Bill 'last' month; $(no) `expansion`",
    }
    assert 'SCHEDTUI_GCP_LOCATION="${SCHEDTUI_GCP_LOCATION:-us-central1}"' in f.content
    # The description is single-quoted for the shell, so nothing in it is expanded.
    assert "--description='Bill '\"'\"'last'\"'\"' month; $(no) `expansion`'" in f.content


def test_gcp_without_description_has_no_flag() -> None:
    (f,) = render_manifests([ext("a", "0 9 * * *")], "gcp", BASE)
    assert "description" not in flags(gcloud_commands(f.content)[0])


@pytest.mark.parametrize(
    ("expr", "gcp"),
    [
        ("0 9 * * 1-5", "0 9 * * 1-5"),
        ("0 0 1 * *", "0 0 1 * *"),
        ("30 2 * * 0", "30 2 * * 0"),
        ("0 12 * * SUN", "0 12 * * 0"),
        ("*/15 * * * *", "*/15 * * * *"),
    ],
)
def test_gcp_cron_conversion(expr: str, gcp: str) -> None:
    (f,) = render_manifests([ext("a", expr)], "gcp", BASE)
    assert flags(gcloud_commands(f.content)[0])["schedule"] == gcp


def test_gcp_either_day_is_two_jobs() -> None:
    (f,) = render_manifests([ext("paydays", "0 9 1,15 * 1")], "gcp", BASE)
    cmds = gcloud_commands(f.content)
    assert [c[5] for c in cmds] == ["schedtui-paydays-dom", "schedtui-paydays-dow"]
    assert [flags(c)["schedule"] for c in cmds] == ["0 9 1,15 * *", "0 9 * * 1"]


# -- azure ------------------------------------------------------------------------------------------


def test_azure_function_app() -> None:
    schedule = ext("monthly-invoice", "0 9 1 * *", description="Bill last month")
    files = by_path(render_manifests([schedule], "azure", BASE))
    fn = "Europe.Berlin/schedtui_monthly_invoice_" + next(
        p.split("_")[-1].split("/")[0] for p in files if p.endswith("function.json")
    )
    assert set(files) == {
        "Europe.Berlin/host.json",
        "Europe.Berlin/requirements.txt",
        "Europe.Berlin/README.md",
        f"{fn}/function.json",
        f"{fn}/__init__.py",
    }
    function = json.loads(files[f"{fn}/function.json"])
    assert function == {
        "scriptFile": "__init__.py",
        "bindings": [
            {
                "name": "timer",
                "type": "timerTrigger",
                "direction": "in",
                "schedule": "0 0 9 1 * *",
                "runOnStartup": False,
                "useMonitor": True,
            }
        ],
    }
    host = json.loads(files["Europe.Berlin/host.json"])
    assert host["version"] == "2.0"
    readme = files["Europe.Berlin/README.md"]
    assert "WEBSITE_TIME_ZONE=Europe/Berlin" in readme
    assert "@Microsoft.KeyVault(VaultName=$KEY_VAULT;SecretName=schedtui-token)" in readme
    assert "| `0 9 1 * *` | `0 0 9 1 * *` | Bill last month |" in readme
    assert "WEBSITE_TIME_ZONE=Europe/Berlin" in files[f"{fn}/__init__.py"]


@pytest.mark.parametrize(("status", "calls"), [(None, 1), (503, 3), (409, 1)])
def test_azure_function_posts_with_the_token_from_app_settings(
    status: int | None, calls: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = render_manifests([ext("monthly-invoice", "0 9 1 * *")], "azure", BASE)
    (code,) = [f.content for f in files if f.path.endswith("__init__.py")]
    namespace: dict[str, Any] = {"__name__": "generated_function"}
    exec(compile(code, "__init__.py", "exec"), namespace)  # noqa: S102 - our own generated code
    seen: list[urllib.request.Request] = []

    class Response:
        def __enter__(self) -> Response:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def read(self) -> bytes:
            return b"{}"

    def urlopen(request: urllib.request.Request, timeout: float) -> Response:
        seen.append(request)
        if status is not None:
            raise urllib.error.HTTPError(request.full_url, status, "nope", {}, None)  # type: ignore[arg-type]  # headers: never read
        return Response()

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(namespace["time"], "sleep", lambda s: None)
    monkeypatch.setenv("SCHEDTUI_TOKEN", CANARY)
    if status is None:
        namespace["main"](object())
    else:
        with pytest.raises(urllib.error.HTTPError):
            namespace["main"](object())
    assert len(seen) == calls
    request = seen[0]
    assert request.full_url == fire_url("monthly-invoice")
    assert request.get_method() == "POST"
    assert request.get_header("Authorization") == f"Bearer {CANARY}"


def test_azure_one_app_per_zone_and_split_days() -> None:
    files = by_path(
        render_manifests(
            [
                ext("berlin", "0 9 * * *"),
                ext("ny", "0 9 * * *", tz="America/New_York"),
                ext("paydays", "0 9 1,15 * 1"),
            ],
            "azure",
            BASE,
        )
    )
    apps = {p.split("/")[0] for p in files}
    assert apps == {"Europe.Berlin", "America.New_York"}
    functions = azure_functions(list(ManifestFile(p, c) for p, c in files.items()))
    berlin = sorted(f for f in functions if f.startswith("Europe.Berlin/"))
    assert len(berlin) == 3
    schedules = sorted(functions[f]["bindings"][0]["schedule"] for f in berlin)
    assert schedules == ["0 0 9 * * *", "0 0 9 * * 1", "0 0 9 1,15 * *"]
    assert any(f.endswith("_dom") for f in berlin) and any(f.endswith("_dow") for f in berlin)
    assert "WEBSITE_TIME_ZONE=America/New_York" in files["America.New_York/README.md"]
    assert "berlin" not in files["America.New_York/README.md"]


@pytest.mark.parametrize(
    ("expr", "ncrontab"),
    [
        ("0 9 * * 1-5", "0 0 9 * * 1-5"),
        ("0 0 1 * *", "0 0 0 1 * *"),
        ("30 2 * * 0", "0 30 2 * * 0"),
        ("0 12 * * SUN", "0 0 12 * * 0"),
        ("*/15 * * * *", "0 */15 * * * *"),
    ],
)
def test_azure_cron_conversion(expr: str, ncrontab: str) -> None:
    functions = azure_functions(render_manifests([ext("a", expr)], "azure", BASE))
    (function,) = functions.values()
    assert function["bindings"][0]["schedule"] == ncrontab


# -- generic ----------------------------------------------------------------------------------------


def test_generic_readme() -> None:
    schedules = [
        ext("monthly-invoice", "0 9 1 * *", description="Bill | last\nmonth"),
        ext("hourly-sync", "@hourly", tz="UTC"),
        ext("own-timer", "0 9 * * *", trigger="self"),
    ]
    (f,) = render_manifests(schedules, "generic", BASE)
    assert f.path == "README.md"
    text = f.content
    assert "| Schedule | Cron | Time zone | Description | URL |" in text
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert rows == [
        f"| `hourly-sync` | `0 * * * *` | UTC |  | `{fire_url('hourly-sync')}` |",
        "| `monthly-invoice` | `0 9 1 * *` | Europe/Berlin | Bill \\| last month | "
        f"`{fire_url('monthly-invoice')}` |",
    ]
    curls = [line for line in text.splitlines() if line.startswith("curl ")]
    assert len(curls) == 2
    argv = shlex.split(curls[1])
    bearer = "Authorization: Bearer $SCHEDTUI_TOKEN"
    assert argv == ["curl", "-fsS", "-X", "POST", "-H", bearer, fire_url("monthly-invoice")]
    assert "Retries are safe" in text and "10 minutes" in text
    assert "own-timer" not in text
