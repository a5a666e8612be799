"""Platform manifests: hand schedtui's external schedules to a platform's scheduler.

A schedule with ``trigger="external"`` is not fired by schedtui's own timer; something
outside calls ``POST {base_url}/schedule/{name}/fire?trigger=external`` with the operator
token as ``Authorization: Bearer …`` at each slot, and the engine fires the newest slot at
or before that moment (at most 10 minutes late). :func:`render_manifests` writes what each
platform needs to make those calls, one or more :class:`ManifestFile` per schedule:

``kubernetes``
    ``<slug>.cronjob.yaml``: a ``batch/v1`` CronJob running a pinned curl image. The token
    comes from the Secret ``schedtui-token`` (key ``token``) through an environment variable.
``aws``
    ``<slug>.cloudformation.json``: a self-contained CloudFormation template, one stack per
    schedule. EventBridge Scheduler is the only AWS scheduler that takes an IANA zone
    (``ScheduleExpressionTimezone``; EventBridge *rules* run in UTC only), but it cannot call
    an HTTPS URL itself, while only EventBridge rules can target an API destination. So the
    template chains the two: an ``AWS::Scheduler::Schedule`` puts an event on the default
    bus at each slot, an ``AWS::Events::Rule`` matching exactly that event sends it to an
    ``AWS::Events::ApiDestination`` (the URL, POST), whose ``AWS::Events::Connection`` adds
    the ``Authorization`` header from the Secrets Manager secret ``schedtui-token`` (JSON key
    ``token``) through a CloudFormation dynamic reference, so the value never appears in
    the template. Two IAM roles let the scheduler put the event and the rule call the API
    destination. API destinations only call ``https://`` endpoints.
``gcp``
    ``<slug>.gcloud.sh``: a POSIX shell script running ``gcloud scheduler jobs create http``.
    It reads the token from Secret Manager (or ``$SCHEDTUI_TOKEN``) when it runs.
``azure``
    One Azure Functions app (Python, v1 programming model) per time zone, in a folder named
    after the zone (``Europe.Berlin/``): ``host.json``, ``requirements.txt``, a ``README.md``
    naming the app settings, and per schedule ``<function>/function.json`` (a timer trigger
    with a six-field NCRONTAB schedule) and ``<function>/__init__.py`` (a standard-library
    POST). Timer triggers take their zone from the app-wide ``WEBSITE_TIME_ZONE`` setting,
    so schedules in different zones cannot share an app; one app per zone keeps every
    schedule deployable instead of refusing mixed zones.
``generic``
    ``README.md``: a table of the external schedules with their URLs and the curl call.

Cron dialects differ exactly where classic cron is subtle, so every platform expression is
rebuilt from the *values* each field means to schedtui (the engine's own parser decides
them, so the manifests cannot drift from it): numbers only, Sunday as 0 (AWS: 1), ``*/n``
only from the start of a field, and at most one restricted day field. In that form the
Kubernetes (robfig/cron), Cloud Scheduler, NCRONTAB and AWS dialects all agree with
schedtui. The day fields need care:

* When both day-of-month and day-of-week are restricted, classic cron fires on a day that
  matches *either*. AWS forbids restricting both, and the other dialects disagree on what
  it means, so such a schedule becomes *two* platform schedules, one per day field, named
  ``…-dom`` and ``…-dow`` (``_dom``/``_dow`` on Azure). On a day matching both, both call
  the engine for the same slot; the engine claims a slot once, so the second call gets the
  first call's run back and nothing fires twice.
* A day field starting with ``*`` (``*/2``) counts as unrestricted, and then a day must
  match both fields (``0 0 */2 * 1``: odd days that are Mondays). No platform dialect can
  say "both", so such a schedule is refused (:class:`BadInput`) for every platform except
  ``generic``.

Every check runs before anything is rendered, so a call either returns every file or
raises: a six-field (seconds) external schedule, an unknown provider, a bad base URL or an
inexpressible schedule raises :class:`~backend.errors.BadInput` naming the culprits.

Names: platform object names are ``schedtui-<schedule name>`` (``schedtui_…`` on Azure)
where that is valid as it stands. Otherwise the name is lowercased and/or has its
disallowed characters replaced, is shortened, and gets ``-`` plus the first 8 hex digits
of the SHA-256 of the schedule name, which keeps it deterministic and unique. File names
use the same rule on the bare schedule name (lowercase letters, digits and ``-``), so
they are also safe on case-insensitive file systems.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any, Final, Literal
from urllib.parse import quote

import yaml

from backend.cron import Cron
from backend.errors import BadInput
from backend.schedules import Schedule

__all__ = ["PROVIDERS", "ManifestFile", "render_manifests"]

PROVIDERS: tuple[str, ...] = ("kubernetes", "aws", "gcp", "azure", "generic")

#: Where the operator token lives on every platform: a secret of this name …
TOKEN_SECRET: Final = "schedtui-token"
#: … holding the token under this key (Kubernetes Secret key, JSON key in Secrets Manager) …
TOKEN_KEY: Final = "token"
#: … and the environment variable / app setting the caller reads it from.
TOKEN_ENV: Final = "SCHEDTUI_TOKEN"
#: A pinned curl image (a moving tag would change what runs without a manifest change).
CURL_IMAGE: Final = "curlimages/curl:8.11.0"
#: How late the engine still accepts an external call for a slot (Engine.external_tolerance).
TOLERANCE_SECONDS: Final = 600

_SECOND: Final = timedelta(seconds=1)
_HASH_LEN: Final = 8
# Kubernetes appends 11 characters to a CronJob's name for its Jobs, so 52 is the limit;
# keep room for the "-dom"/"-dow" suffix of a split schedule.
_K8S_NAME_MAX: Final = 52 - 4
_K8S_LABEL_MAX: Final = 63
_AWS_NAME_MAX: Final = 64 - 4
_GCP_NAME_MAX: Final = 500 - 4
_AZURE_NAME_MAX: Final = 127 - 4
_FILE_SLUG_MAX: Final = 100

_BASE_URL_RE: Final = re.compile(
    r"(?P<scheme>https?)://"
    r"(?P<host>[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?)*"
    r"|\[[0-9A-Fa-f:.]+\])"
    r"(?::(?P<port>[0-9]{1,5}))?"
    r"(?P<path>(?:/(?:[A-Za-z0-9._~-]|%[0-9A-Fa-f]{2})+)*)",
    re.ASCII | re.IGNORECASE,
)
_SPACE_RE: Final = re.compile(r"\s+")


@dataclass(frozen=True)
class ManifestFile:
    """One file to write: a relative path (``/``-separated) and its text."""

    path: str
    content: str


def render_manifests(schedules: Sequence[Schedule], provider: str, base_url: str) -> list[ManifestFile]:
    """The files that let ``provider`` fire the external schedules among ``schedules``.

    Schedules fired by their own timer are left out; with no external schedule at all the
    result is empty. Raises :class:`BadInput` for an unknown provider, a base URL that is
    not ``http(s)://host[:port][/path]``, and any external schedule the platform cannot
    fire faithfully (six fields; day fields that must both match); nothing is rendered then.
    """
    if provider not in PROVIDERS:
        raise BadInput(
            f'unknown provider "{provider}" (choose one of {", ".join(PROVIDERS)})', field="provider"
        )
    base = _base_url(base_url, provider)
    external = sorted(
        (s for s in schedules if s.effective_trigger() == "external"), key=lambda s: s.name
    )
    _check_names_unique(external)
    _check_minute_granular(external)
    if not external:
        return []
    if provider == "generic":
        return [_generic(external, base)]
    plans = _plans(external, provider, base)
    files = _RENDERERS[provider](plans)
    _check_paths_unique(files)
    return files


# -- checks -------------------------------------------------------------------------------


def _base_url(base_url: str, provider: str) -> str:
    """``base_url`` without one trailing slash, or :class:`BadInput`."""
    text = base_url[:-1] if isinstance(base_url, str) and base_url.endswith("/") else base_url
    match = _BASE_URL_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None or (match["port"] is not None and not 0 < int(match["port"]) < 65536):
        raise BadInput(
            f'invalid base URL "{base_url}": expected http(s)://host[:port][/path] '
            "(no credentials, query, fragment or spaces)",
            field="base_url",
        )
    scheme = match["scheme"].lower()
    if provider == "aws" and scheme != "https":
        raise BadInput(
            f'invalid base URL "{base_url}" for aws: EventBridge API destinations only call https:// endpoints',
            field="base_url",
        )
    port = f":{match['port']}" if match["port"] is not None else ""
    return f"{scheme}://{match['host']}{port}{match['path']}"


def _check_names_unique(schedules: Sequence[Schedule]) -> None:
    names = [s.name for s in schedules]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise BadInput(f"schedule name(s) given more than once: {', '.join(twice)}")


def _check_minute_granular(schedules: Sequence[Schedule]) -> None:
    bad = [s for s in schedules if s.cron.has_seconds]
    if bad:
        which = "; ".join(f'"{s.name}" (cron "{s.cron.expr}")' for s in bad)
        raise BadInput(
            "external schedulers fire at most once a minute, but these external schedules have a "
            f"seconds field: {which}. Give them five fields or the self trigger; no manifests were written."
        )


def _check_paths_unique(files: Sequence[ManifestFile]) -> None:
    paths = [f.path for f in files]
    if len(set(paths)) != len(paths):  # pragma: no cover - needs a SHA-256 prefix collision
        raise BadInput("two schedules map to the same file name; rename one of them")


# -- names and text -------------------------------------------------------------------------


def _safe_name(
    text: str,
    *,
    key: str,
    allowed: str,
    max_len: int,
    sep: str = "-",
    lower: bool = False,
    alnum_edges: bool = False,
) -> str:
    """``text`` when it is valid as it stands, else a valid, deterministic stand-in.

    ``allowed`` is the body of a regex character class. The stand-in is ``text`` with
    the disallowed characters replaced by ``sep``, lowercased if asked, shortened, and
    followed by ``sep`` and a hash of ``key`` (the schedule name), which keeps it unique.
    """
    candidate = re.sub(f"[^{allowed}]", sep, text.lower() if lower else text)
    if alnum_edges:
        candidate = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", candidate)
    if candidate == text and 0 < len(candidate) <= max_len:
        return candidate
    digest = hashlib.sha256(key.encode()).hexdigest()[:_HASH_LEN]
    body = candidate[: max_len - _HASH_LEN - len(sep)]
    if alnum_edges:
        body = re.sub(r"[^A-Za-z0-9]+$", "", body)
    return f"{body}{sep}{digest}" if body else digest


def _file_slug(name: str) -> str:
    return _safe_name(name, key=name, allowed="a-z0-9-", max_len=_FILE_SLUG_MAX, lower=True, alnum_edges=True)


def _fire_url(base: str, name: str) -> str:
    return f"{base}{_fire_path(name)}?trigger=external"


def _fire_path(name: str) -> str:
    segment = quote(name, safe="")
    if segment in (".", ".."):  # a dot segment would be collapsed by clients
        segment = segment.replace(".", "%2E")
    return f"/schedule/{segment}/fire"


def _one_line(text: str, limit: int | None = None) -> str:
    flat = _SPACE_RE.sub(" ", text).strip()
    if limit is not None and len(flat) > limit:
        flat = flat[: limit - 3].rstrip() + "..."
    return flat


# -- what each schedule means, in a portable form ----------------------------------------------


@dataclass(frozen=True)
class _Fire:
    """One platform schedule: the values of each field, with at most one day field set.

    ``days`` None means every day of the month, ``weekdays`` None every day of the week
    (0 = Sunday). ``part`` is "" for a whole schedule, "dom"/"dow" for half of a split one.
    """

    part: Literal["", "dom", "dow"]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int] | None
    months: frozenset[int]
    weekdays: frozenset[int] | None


@dataclass(frozen=True)
class _Plan:
    schedule: Schedule
    url: str
    fires: tuple[_Fire, ...]


_PROBE_START: Final = datetime(2001, 1, 1, tzinfo=UTC)  # a Monday in a common year
_LONGEST_MONTH: Final = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _values(expr: str, span: timedelta, part: Callable[[datetime], int]) -> frozenset[int]:
    """What one field means: fire ``expr`` (UTC) over ``span`` from the probe start."""
    cron = Cron(expr, "UTC")
    slots = cron.occurrences(_PROBE_START - _SECOND, _PROBE_START + span - _SECOND)
    return frozenset(part(t) for t in slots)


def _fires(schedule: Schedule) -> tuple[_Fire, ...] | str:
    """The platform schedules for ``schedule``, or why it cannot be expressed."""
    minute, hour, dom, month, dow = schedule.cron.fields
    # The engine's parser reads each field (names, 7 for Sunday, "a/n" to the field's end…),
    # so each probe fires the field alone against unrestricted others and reads it back.
    minutes = _values(f"{minute} 0 1 1 *", timedelta(hours=1), lambda t: t.minute)
    hours = _values(f"0 {hour} 1 1 *", timedelta(days=1), lambda t: t.hour)
    days = _values(f"0 0 {dom} 1 *", timedelta(days=31), lambda t: t.day)
    months = _values(f"0 0 1 {month} *", timedelta(days=365), lambda t: t.month)
    weekdays = _values(f"0 0 * * {dow}", timedelta(days=7), lambda t: (t.weekday() + 1) % 7)

    def fire(part: Literal["", "dom", "dow"], d: frozenset[int] | None, w: frozenset[int] | None) -> _Fire:
        return _Fire(part, minutes, hours, d, months, w)

    every_dom, every_dow = len(days) == 31, len(weekdays) == 7
    if every_dom and every_dow:
        return (fire("", None, None),)
    if not dom.startswith("*") and not dow.startswith("*"):
        # Classic cron: a day matching either field fires.
        if every_dom or every_dow:
            return (fire("", None, None),)
        if not any(d <= _LONGEST_MONTH[m] for m in months for d in days):
            return (fire("", None, weekdays),)  # the day-of-month half could never fire
        return (fire("dom", days, None), fire("dow", None, weekdays))
    if every_dom:
        return (fire("", None, weekdays),)
    if every_dow:
        return (fire("", days, None),)
    return (
        f'"{schedule.name}" (cron "{schedule.cron.expr}") fires only on days matching both '
        f'day-of-month "{dom}" and day-of-week "{dow}"'
    )


def _plans(schedules: Sequence[Schedule], provider: str, base: str) -> list[_Plan]:
    plans: list[_Plan] = []
    problems: list[str] = []
    for schedule in schedules:
        fires = _fires(schedule)
        if isinstance(fires, str):
            problems.append(fires)
        else:
            plans.append(_Plan(schedule, _fire_url(base, schedule.name), fires))
    if problems:
        raise BadInput(
            f"{provider} cannot express these external schedules: {'; '.join(problems)}. "
            "A platform cron either restricts one day field or fires on a day matching either "
            "field; restrict a single day field, or use the self trigger. No manifests were written."
        )
    return plans


def _field(values: frozenset[int], low: int, high: int, *, steps: Literal["star", "start", "none"]) -> str:
    """A field's values as cron text: ``*``, ``*/n`` (or AWS ``a/n``), ranges and lists.

    ``star`` writes ``*/n`` only for a progression that starts at the field's first value
    and runs to its end; ``start`` (AWS) writes ``a/n`` for any progression running to the
    end; ``none`` uses ranges and lists only (AWS day-of-week has no increments).
    """
    vals = sorted(values)
    if len(vals) == high - low + 1:
        return "*"
    if steps != "none" and len(vals) >= 3:
        step = vals[1] - vals[0]
        if step >= 2 and vals[-1] + step > high and all(b - a == step for a, b in pairwise(vals)):
            if steps == "start":
                return f"{vals[0]}/{step}"
            if vals[0] == low:
                return f"*/{step}"
    items: list[str] = []
    run_start = prev = vals[0]
    for value in [*vals[1:], None]:
        if value is not None and value == prev + 1:
            prev = value
            continue
        if prev - run_start >= 2:
            items.append(f"{run_start}-{prev}")
        else:
            items.extend(str(v) for v in range(run_start, prev + 1))
        if value is not None:
            run_start = prev = value
    return ",".join(items)


def _unix_cron(fire: _Fire) -> str:
    """Five fields for robfig/cron (Kubernetes), Cloud Scheduler and (after "0 ") NCRONTAB."""
    return " ".join(
        (
            _field(fire.minutes, 0, 59, steps="star"),
            _field(fire.hours, 0, 23, steps="star"),
            "*" if fire.days is None else _field(fire.days, 1, 31, steps="star"),
            _field(fire.months, 1, 12, steps="star"),
            "*" if fire.weekdays is None else _field(fire.weekdays, 0, 6, steps="star"),
        )
    )


def _aws_cron(fire: _Fire) -> str:
    """``cron(min hour dom month dow year)``: one day field is ``?``; Sunday is 1."""
    if fire.weekdays is None:
        dom = "*" if fire.days is None else _field(fire.days, 1, 31, steps="start")
        dow = "?"
    else:
        dom = "?"
        dow = _field(frozenset(d + 1 for d in fire.weekdays), 1, 7, steps="none")
    minute = _field(fire.minutes, 0, 59, steps="start")
    hour = _field(fire.hours, 0, 23, steps="start")
    month = _field(fire.months, 1, 12, steps="start")
    return f"cron({minute} {hour} {dom} {month} {dow} *)"


def _suffixed(name: str, fire: _Fire, sep: str = "-") -> str:
    return f"{name}{sep}{fire.part}" if fire.part else name


_GENERATED: Final = "Generated by `schedtui manifest --provider {provider}`; regenerate it rather than editing it."


def _header(provider: str, schedule: Schedule) -> list[str]:
    lines = [
        _GENERATED.format(provider=provider),
        f'Schedule "{schedule.name}": cron "{schedule.cron.expr}" in {schedule.timezone}.',
    ]
    if schedule.description:
        lines.append(f"Description: {_one_line(schedule.description, 200)}")
    return [f"# {line}" for line in lines]


_SPLIT_NOTE: Final = (
    "Both day fields are restricted, so a day matching either fires: one platform schedule per "
    "day field. On a day matching both, the engine fires the slot once and answers the second "
    "call with the same run."
)


# -- kubernetes ---------------------------------------------------------------------------------


def _kubernetes(plans: Sequence[_Plan]) -> list[ManifestFile]:
    files = []
    for plan in plans:
        s = plan.schedule
        name = _safe_name(
            f"schedtui-{s.name}", key=s.name, allowed="a-z0-9-", max_len=_K8S_NAME_MAX, lower=True, alnum_edges=True
        )
        labels = {
            "app.kubernetes.io/name": "schedtui",
            "app.kubernetes.io/component": "external-trigger",
            "schedtui/schedule": _safe_name(
                s.name, key=s.name, allowed="A-Za-z0-9_.-", max_len=_K8S_LABEL_MAX, alnum_edges=True
            ),
        }
        annotations = {"schedtui/schedule-name": s.name, "schedtui/cron": s.cron.expr}
        if s.description:
            annotations["schedtui/description"] = s.description
        docs = [_cronjob(_suffixed(name, fire), _unix_cron(fire), s.timezone, plan.url, labels, annotations)
                for fire in plan.fires]
        header = _header("kubernetes", s)
        header.append(
            f'# Needs the Secret "{TOKEN_SECRET}" (key "{TOKEN_KEY}": the schedtui operator token) in the same '
            "namespace, and Kubernetes 1.27+ for spec.timeZone."
        )
        if len(docs) > 1:
            header.append(f"# {_SPLIT_NOTE}")
        body = yaml.safe_dump_all(docs, sort_keys=False, explicit_start=True, allow_unicode=True, width=1000)
        files.append(ManifestFile(f"{_file_slug(s.name)}.cronjob.yaml", "\n".join(header) + "\n" + body))
    return files


def _cronjob(
    name: str, cron: str, zone: str, url: str, labels: dict[str, str], annotations: dict[str, str]
) -> dict[str, Any]:
    container = {
        "name": "fire",
        "image": CURL_IMAGE,
        # Retrying is safe: the engine claims each slot once, so a repeated call for the
        # same slot gets the run already started back instead of firing again.
        "command": ["curl"],
        "args": [
            "-fsS", "--retry", "3", "--retry-all-errors", "--connect-timeout", "10", "--max-time", "30",
            "-X", "POST", "-H", f"Authorization: Bearer $({TOKEN_ENV})", url,
        ],
        # $(SCHEDTUI_TOKEN) above is expanded by the kubelet from this env var; the token
        # itself stays in the Secret.
        "env": [{"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": TOKEN_SECRET, "key": TOKEN_KEY}}}],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    pod = {
        # Never: each failed attempt stays as its own pod, with its log, for `kubectl logs`;
        # the Job makes a new pod (up to backoffLimit) instead of restarting in place.
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65534,
            "runAsGroup": 65534,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        # Copies, so that the YAML has no anchors and aliases.
        "metadata": {"name": name, "labels": dict(labels), "annotations": dict(annotations)},
        "spec": {
            "schedule": cron,
            "timeZone": zone,
            # Never two calls for one schedule at once; the engine dedupes them anyway.
            "concurrencyPolicy": "Forbid",
            # The engine accepts a call up to 10 minutes after its slot. A Job may start at
            # most 300 s late and may run at most 240 s (activeDeadlineSeconds below), so
            # every attempt, retries included, lands inside that window; a later start is
            # skipped by the controller rather than refused by the engine.
            "startingDeadlineSeconds": 300,
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "backoffLimit": 2,
                    "activeDeadlineSeconds": 240,
                    "template": {"metadata": {"labels": dict(labels)}, "spec": pod},
                },
            },
        },
    }


# -- aws ----------------------------------------------------------------------------------------

_EVENT_SOURCE: Final = "schedtui.scheduler"
_EVENT_DETAIL_TYPE: Final = "schedtui fire"
_DEFAULT_BUS_ARN: Final = {
    "Fn::Sub": "arn:${AWS::Partition}:events:${AWS::Region}:${AWS::AccountId}:event-bus/default"
}
_AWS_TOKEN_REF: Final = f"{{{{resolve:secretsmanager:{TOKEN_SECRET}:SecretString:{TOKEN_KEY}}}}}"


def _aws(plans: Sequence[_Plan]) -> list[ManifestFile]:
    files = []
    for plan in plans:
        s = plan.schedule
        slug = _file_slug(s.name)
        name = _safe_name(f"schedtui-{s.name}", key=s.name, allowed="0-9A-Za-z_.-", max_len=_AWS_NAME_MAX)
        what = f'schedtui schedule "{s.name}"'
        endpoint = plan.url.partition("?")[0]
        resources: dict[str, Any] = {
            "Connection": {
                "Type": "AWS::Events::Connection",
                "Properties": {
                    "Name": name,
                    "Description": f"Operator token for {what}"[:512],
                    "AuthorizationType": "API_KEY",
                    "AuthParameters": {
                        "ApiKeyAuthParameters": {
                            "ApiKeyName": "Authorization",
                            # A dynamic reference: CloudFormation reads the secret at deploy time.
                            "ApiKeyValue": f"Bearer {_AWS_TOKEN_REF}",
                        }
                    },
                },
            },
            "ApiDestination": {
                "Type": "AWS::Events::ApiDestination",
                "Properties": {
                    "Name": name,
                    "Description": f"Fire endpoint of {what}"[:512],
                    "ConnectionArn": {"Fn::GetAtt": ["Connection", "Arn"]},
                    "InvocationEndpoint": endpoint,
                    "HttpMethod": "POST",
                },
            },
            "RuleRole": _aws_role(
                "events.amazonaws.com", "events:InvokeApiDestination", {"Fn::GetAtt": ["ApiDestination", "Arn"]}
            ),
            "Rule": {
                "Type": "AWS::Events::Rule",
                "Properties": {
                    "Name": name,
                    "Description": f"Send the scheduler's events for {what} to its endpoint"[:512],
                    "State": "ENABLED",
                    "EventPattern": {
                        "source": [_EVENT_SOURCE],
                        "detail-type": [_EVENT_DETAIL_TYPE],
                        "detail": {"schedule": [s.name]},
                    },
                    "Targets": [
                        {
                            "Id": "fire",
                            "Arn": {"Fn::GetAtt": ["ApiDestination", "Arn"]},
                            "RoleArn": {"Fn::GetAtt": ["RuleRole", "Arn"]},
                            "HttpParameters": {"QueryStringParameters": {"trigger": "external"}},
                            "Input": "{}",
                            # Retrying is safe: the engine claims each slot once. 240 s here
                            # plus at most 300 s in the scheduler stays inside the engine's
                            # 10-minute tolerance.
                            "RetryPolicy": {"MaximumRetryAttempts": 3, "MaximumEventAgeInSeconds": 240},
                        }
                    ],
                },
            },
            "SchedulerRole": _aws_role("scheduler.amazonaws.com", "events:PutEvents", _DEFAULT_BUS_ARN),
        }
        for fire in plan.fires:
            props: dict[str, Any] = {
                "Name": _suffixed(name, fire),
                "GroupName": "default",
                "ScheduleExpression": _aws_cron(fire),
                "ScheduleExpressionTimezone": s.timezone,
                "FlexibleTimeWindow": {"Mode": "OFF"},
                "State": "ENABLED",
                "Target": {
                    "Arn": _DEFAULT_BUS_ARN,
                    "RoleArn": {"Fn::GetAtt": ["SchedulerRole", "Arn"]},
                    "Input": json.dumps({"schedule": s.name}),
                    "EventBridgeParameters": {"DetailType": _EVENT_DETAIL_TYPE, "Source": _EVENT_SOURCE},
                    "RetryPolicy": {"MaximumRetryAttempts": 3, "MaximumEventAgeInSeconds": 300},
                },
            }
            if s.description:
                props["Description"] = _one_line(s.description, 512)
            resources["Schedule" + {"": "", "dom": "Dom", "dow": "Dow"}[fire.part]] = {
                "Type": "AWS::Scheduler::Schedule",
                "Properties": props,
            }
        metadata: dict[str, Any] = {
            "schedule": s.name,
            "cron": s.cron.expr,
            "timezone": s.timezone,
            "url": plan.url,
            "token": f'Secrets Manager secret "{TOKEN_SECRET}" holding {{"{TOKEN_KEY}": "<operator token>"}}',
            "deploy": (
                f"aws cloudformation deploy --template-file {slug}.cloudformation.json "
                f"--stack-name {_safe_name('schedtui-' + s.name, key=s.name, allowed='A-Za-z0-9-', max_len=120)} "
                "--capabilities CAPABILITY_IAM"
            ),
        }
        if len(plan.fires) > 1:
            metadata["note"] = _SPLIT_NOTE
        template = {
            "AWSTemplateFormatVersion": "2010-09-09",
            "Description": f"schedtui: fire {what} from EventBridge Scheduler"[:1024],
            "Metadata": {"schedtui": metadata},
            "Resources": resources,
        }
        content = json.dumps(template, indent=2, ensure_ascii=False) + "\n"
        files.append(ManifestFile(f"{slug}.cloudformation.json", content))
    return files


def _aws_role(service: str, action: str, resource: Any) -> dict[str, Any]:
    return {
        "Type": "AWS::IAM::Role",
        "Properties": {
            "AssumeRolePolicyDocument": {
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}],
            },
            "Policies": [
                {
                    "PolicyName": action.replace(":", "-"),
                    "PolicyDocument": {
                        "Version": "2012-10-17",
                        "Statement": [{"Effect": "Allow", "Action": action, "Resource": resource}],
                    },
                }
            ],
        },
    }


# -- gcp ----------------------------------------------------------------------------------------


def _gcp(plans: Sequence[_Plan]) -> list[ManifestFile]:
    files = []
    for plan in plans:
        s = plan.schedule
        job = _safe_name(f"schedtui-{s.name}", key=s.name, allowed="A-Za-z0-9_-", max_len=_GCP_NAME_MAX)
        lines = ["#!/bin/sh", *_header("gcp", s)]
        lines += [
            "# Creates the Cloud Scheduler job(s) that fire it; run once, with gcloud logged in to the project.",
            f'# The operator token is read from Secret Manager ("{TOKEN_SECRET}") or ${TOKEN_ENV} when this runs;',
            "# Cloud Scheduler keeps the header in the job, so limit who may view the project's jobs.",
            "# The token must not contain a comma (gcloud splits --headers on commas).",
        ]
        if len(plan.fires) > 1:
            lines.append(f"# {_SPLIT_NOTE}")
        lines += [
            "set -eu",
            'SCHEDTUI_GCP_LOCATION="${SCHEDTUI_GCP_LOCATION:-us-central1}"',
            f'SCHEDTUI_TOKEN_SECRET="${{SCHEDTUI_TOKEN_SECRET:-{TOKEN_SECRET}}}"',
            f'if [ -z "${{{TOKEN_ENV}:-}}" ]; then',
            f'  {TOKEN_ENV}="$(gcloud secrets versions access latest --secret="$SCHEDTUI_TOKEN_SECRET")"',
            "fi",
            f': "${{{TOKEN_ENV}:?the schedtui operator token is empty}}"',
            "",
        ]
        for fire in plan.fires:
            args = [
                f"gcloud scheduler jobs create http {shlex.quote(_suffixed(job, fire))}",
                '--location="$SCHEDTUI_GCP_LOCATION"',
                "--schedule=" + shlex.quote(_unix_cron(fire)),
                "--time-zone=" + shlex.quote(s.timezone),
                "--uri=" + shlex.quote(plan.url),
                "--http-method=POST",
                f'--headers="Authorization=Bearer ${{{TOKEN_ENV}}}"',
                # Each attempt may take 60 s; retries (safe: the engine claims a slot once)
                # stop after 300 s, well inside the engine's 10-minute tolerance.
                "--attempt-deadline=60s",
                "--max-retry-attempts=3",
                "--max-retry-duration=300s",
                "--min-backoff=10s",
                "--max-backoff=60s",
            ]
            if s.description:
                args.append("--description=" + shlex.quote(_one_line(s.description, 480)))
            lines.append(" \\\n    ".join(args))
        files.append(ManifestFile(f"{_file_slug(s.name)}.gcloud.sh", "\n".join(lines) + "\n"))
    return files


# -- azure --------------------------------------------------------------------------------------

_AZURE_HOST_JSON: Final = {
    "version": "2.0",
    "extensionBundle": {"id": "Microsoft.Azure.Functions.ExtensionBundle", "version": "[4.*, 5.0.0)"},
}

_AZURE_FUNCTION_PY: Final = '''\
"""schedtui: fire the external schedule "{name}" (cron "{expr}", {zone}).

{generated}
The timer in function.json runs in the app's time zone, so the app needs
WEBSITE_TIME_ZONE={zone} (see ../README.md). The operator token comes from the
{token_env} app setting, which should be a Key Vault reference.
"""

import os
import time
import urllib.error
import urllib.request

URL = {url!r}
# Retrying is safe: the engine claims each slot once, so a repeated call for the same
# slot gets the run it already started back instead of firing again.
ATTEMPTS = 3


def main(timer) -> None:
    request = urllib.request.Request(
        URL,
        data=b"",
        method="POST",
        headers={{"Authorization": "Bearer " + os.environ[{token_env!r}]}},
    )
    for attempt in range(1, ATTEMPTS + 1):
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()
            return
        except urllib.error.HTTPError as exc:
            if attempt == ATTEMPTS or (exc.code < 500 and exc.code != 429):
                raise
        except OSError:  # refused, reset, DNS failure, timeout
            if attempt == ATTEMPTS:
                raise
        time.sleep(10 * attempt)
'''


def _azure(plans: Sequence[_Plan]) -> list[ManifestFile]:
    by_zone: dict[str, list[_Plan]] = {}
    for plan in plans:
        by_zone.setdefault(plan.schedule.timezone, []).append(plan)
    files: list[ManifestFile] = []
    for zone, zone_plans in sorted(by_zone.items()):
        app = zone.replace("/", ".")  # IANA names have no dots, so this is one-to-one
        rows: list[str] = []
        for plan in zone_plans:
            s = plan.schedule
            function = _safe_name(
                f"schedtui_{s.name}", key=s.name, allowed="a-z0-9_", sep="_", max_len=_AZURE_NAME_MAX, lower=True
            )
            for fire in plan.fires:
                fn = _suffixed(function, fire, "_")
                ncrontab = "0 " + _unix_cron(fire)
                binding = {
                    "name": "timer",
                    "type": "timerTrigger",
                    "direction": "in",
                    "schedule": ncrontab,
                    # A run on start-up (deploys, restarts) would be a call outside any slot.
                    "runOnStartup": False,
                    "useMonitor": True,
                }
                function_json = {"scriptFile": "__init__.py", "bindings": [binding]}
                code = _AZURE_FUNCTION_PY.format(
                    name=s.name,
                    expr=s.cron.expr,
                    zone=zone,
                    url=plan.url,
                    token_env=TOKEN_ENV,
                    generated=_GENERATED.format(provider="azure"),
                )
                files.append(ManifestFile(f"{app}/{fn}/function.json", json.dumps(function_json, indent=2) + "\n"))
                files.append(ManifestFile(f"{app}/{fn}/__init__.py", code))
                description = _md_cell(s.description or "")
                rows.append(f"| `{fn}` | `{s.name}` | `{s.cron.expr}` | `{ncrontab}` | {description} |")
        files.append(ManifestFile(f"{app}/host.json", json.dumps(_AZURE_HOST_JSON, indent=2) + "\n"))
        files.append(ManifestFile(f"{app}/requirements.txt", "azure-functions\n"))
        files.append(ManifestFile(f"{app}/README.md", _azure_readme(zone, rows)))
    return files


def _azure_readme(zone: str, rows: Sequence[str]) -> str:
    settings = (
        f'az functionapp config appsettings set --name "$APP" --resource-group "$RESOURCE_GROUP" \\\n'
        f"    --settings {shlex.quote('WEBSITE_TIME_ZONE=' + zone)} \\\n"
        f'    "{TOKEN_ENV}=@Microsoft.KeyVault(VaultName=$KEY_VAULT;SecretName={TOKEN_SECRET})"'
    )
    return "\n".join(
        [
            f"# schedtui timers in {zone}",
            "",
            _GENERATED.format(provider="azure"),
            "",
            "This folder is one Azure Functions app (Python, v1 programming model) whose timers call",
            "schedtui's fire endpoint. A timer trigger runs in the time zone of its whole app, so every",
            f"schedule in this app is in {zone}, and the app needs two settings:",
            "",
            f"- `WEBSITE_TIME_ZONE={zone}`: the zone of every timer here. Linux Premium and Dedicated",
            "  plans take this IANA name; Windows plans need the Windows name of the same zone; Linux",
            "  Consumption plans run timers in UTC only, so use another plan unless the zone is UTC.",
            f"- `{TOKEN_ENV}`: the schedtui operator token, as a Key Vault reference to the secret",
            f"  `{TOKEN_SECRET}` (never the token itself).",
            "",
            "```sh",
            settings,
            'func azure functionapp publish "$APP"',
            "```",
            "",
            "| Function | Schedule | Cron | NCRONTAB | Description |",
            "| --- | --- | --- | --- | --- |",
            *rows,
            "",
        ]
    )


# -- generic ------------------------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return _one_line(text).replace("\\", "\\\\").replace("|", "\\|")


def _generic(schedules: Sequence[Schedule], base: str) -> ManifestFile:
    rows = []
    calls = []
    for s in schedules:
        url = _fire_url(base, s.name)
        rows.append(
            f"| `{s.name}` | `{s.cron.expr}` | {s.timezone} | {_md_cell(s.description or '')} | `{url}` |"
        )
        calls.append(f"curl -fsS -X POST -H \"Authorization: Bearer ${TOKEN_ENV}\" {shlex.quote(url)}")
    lines = [
        "# schedtui external schedules",
        "",
        _GENERATED.format(provider="generic"),
        "",
        "These schedules are not fired by schedtui's own timer. Have your scheduler send one HTTP POST",
        "per slot, computed in the schedule's time zone:",
        "",
        "| Schedule | Cron | Time zone | Description | URL |",
        "| --- | --- | --- | --- | --- |",
        *rows,
        "",
        "## The call",
        "",
        "```sh",
        *calls,
        "```",
        "",
        f"`{TOKEN_ENV}` is the schedtui operator token. Keep it in your platform's secret store and give",
        "it to the caller when it runs; do not write it into job definitions.",
        "",
        "- **Retries are safe.** The engine claims each slot once, so a repeated call for a slot it has",
        "  already fired returns the same run (HTTP 200; the first call answers 202) and fires nothing.",
        "- **Timing.** The engine fires the newest slot at or before the moment the call arrives and",
        f"  accepts the call up to {TOLERANCE_SECONDS // 60} minutes after that slot; a later call is refused (409).",
        "  A call that arrives before its slot counts for the previous slot, so never fire early.",
        "- **Day fields.** As in classic cron, when day-of-month and day-of-week are both restricted a",
        "  day matching either fires, and a day field starting with `*` (such as `*/2`) counts as",
        "  unrestricted, so then a day must match both.",
        "",
    ]
    return ManifestFile("README.md", "\n".join(lines))


_RENDERERS: Final[dict[str, Callable[[Sequence[_Plan]], list[ManifestFile]]]] = {
    "kubernetes": _kubernetes,
    "aws": _aws,
    "gcp": _gcp,
    "azure": _azure,
}
