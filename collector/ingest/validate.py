"""Per-event rules that a schema cannot express: platform rewrite, web rules, truncation.

Pure functions over decoded Structs; each returns the event to store or a
list of issues.
"""

from __future__ import annotations

import functools
import re
from urllib.parse import unquote, unquote_plus, urlsplit

import msgspec

from collector.ingest.model import EventIssue
from collector.ingest.schema import (
    AnyEvent,
    Consent,
    ConsentTransition,
    Device,
    EventConsent,
    Form,
    Identify,
    Page,
)

URL_MAX = 2048
TITLE_MAX = 512
USER_AGENT_MAX = 512  # spec 2.2: longer is rejected, not truncated (schema.Device)
NATIVE = frozenset({"ios", "android", "react-native", "server"})


def rewrite_platform(event: AnyEvent, key_type: str) -> AnyEvent:
    """Spec 2.4: the collector stamps clientPlatform by key type before validation."""
    device = event.device
    if device is None and not isinstance(event, ConsentTransition):
        return event  # required (spec 2.2): check_event refuses it, whatever the key
    declared = device.clientPlatform if device is not None else None
    if key_type == "server":
        wanted: str | None = "server"
    elif key_type == "mobile":
        wanted = declared or "react-native"
    else:
        wanted = None if declared in NATIVE else declared  # website keys validate as web
    if wanted == declared:
        return event
    new_device = msgspec.structs.replace(device or Device(), clientPlatform=wanted)  # type: ignore[arg-type]
    return msgspec.structs.replace(event, device=new_device)


def _truncate(page: Page) -> Page:
    url, path, title, referrer = page.url, page.path, page.title, page.referrer
    if (
        (url is None or len(url) <= URL_MAX)
        and len(path) <= URL_MAX
        and len(title) <= TITLE_MAX
        and (referrer is None or len(referrer) <= URL_MAX)
    ):
        return page
    return Page(
        path=path[:URL_MAX],
        title=title[:TITLE_MAX],
        url=url[:URL_MAX] if url is not None else None,
        referrer=referrer[:URL_MAX] if referrer is not None else None,
    )


def _web_url_issue(url: str | None) -> str | None:
    if url is None:
        return "page.url is required for web events"
    # A batch repeats its page URL; the verdict of a URL never changes.
    if len(url) <= URL_MAX:
        return _cached_url_issue(url)
    return _url_issue(url)


# A URL as a browser gives it (location.href) holds no control character and no
# space around it or in its host; urlsplit would take "http://local host/",
# "http://\x00/" or a leading space without a word. (A space in a path or query,
# which a browser percent-encodes, is let through: an SDK may build the URL itself.)
# (and C1 controls and the Unicode line separators, which split a stored line in two)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _url_issue(url: str) -> str | None:
    if _CONTROL.search(url):
        return "page.url holds a control character: percent-encode it"
    if url != url.strip(" "):
        return "page.url starts or ends with a space"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a port that is not 0-65535)
    except ValueError:
        return "page.url does not parse as a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname or any(ch.isspace() for ch in parts.netloc):
        return "page.url must be an http(s) URL with a host"
    return None


_cached_url_issue = functools.lru_cache(maxsize=1024)(_url_issue)


def _trailing_newlines(event: AnyEvent, fields: tuple[str, ...]) -> list[EventIssue]:
    """A pattern's $ let a final newline through ("aa...a\\n" was stored as a hem)."""
    return [
        EventIssue(f"$.{name}", f"{name} ends with a newline: send the value alone")
        for name in fields
        if (getattr(event, name) or "").endswith("\n")
    ]


# The fields of a consent object (spec 2.2).
CONSENT_FIELDS = frozenset(field.encode_name for field in msgspec.structs.fields(Consent))
# The misspellings schema.EventConsent reads, with the spelling meant.
_MISSPELT_CONSENT = tuple(
    (field.name, field.encode_name, "identityResolution" if "identity" in field.name else "thirdPartySharing")
    for field in msgspec.structs.fields(EventConsent)
    if field.encode_name not in CONSENT_FIELDS
)


def _misspelt_consent(consent: EventConsent) -> list[EventIssue]:
    return [
        EventIssue(f"$.consent.{wire}", f"`{wire}` is not a consent field: write `{meant}`")
        for name, wire, meant in _MISSPELT_CONSENT
        if getattr(consent, name) is not None
    ]


def misspelt_identity_denial(consent: EventConsent) -> bool:
    """Whether a misspelling of identityResolution (refused, above) says false."""
    return any(
        getattr(consent, name) is False for name, _, meant in _MISSPELT_CONSENT if meant == "identityResolution"
    )


_IDENTITY_DENIAL_NAMES = frozenset(wire for _, wire, meant in _MISSPELT_CONSENT if meant == "identityResolution")


def denial_in_undecodable(raw: object) -> str | None:
    """The visitor whose identity denial an event that did not decode states, if it does.

    An event refused before it became a struct (a consent timestamp "now") still
    says what the visitor chose: a misspelt denial in any event, or
    `identityResolution: false` in a `_consent_transition`, as for decoded ones.
    """
    if not isinstance(raw, dict):
        return None
    consent, visitor = raw.get("consent"), raw.get("visitorId")
    if not isinstance(consent, dict) or not isinstance(visitor, str):
        return None
    names = _IDENTITY_DENIAL_NAMES | ({"identityResolution"} if raw.get("type") == "_consent_transition" else set())
    return visitor if any(_says_no(consent.get(name)) for name in names) else None


_NO = frozenset({"false", "no", "0", "off", "denied"})


def _says_no(value: object) -> bool:
    """A refusal however the SDK wrote it: false, 0, or "false" (why the event did not decode)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value == 0
    return isinstance(value, str) and value.strip().lower() in _NO


# Built once: msgspec.json.decode(..., type=dict[str, str]) builds the type on every call.
RAW_FIELDS_DECODER = msgspec.json.Decoder(dict[str, str])


def check_event(event: AnyEvent) -> tuple[AnyEvent, list[EventIssue]]:
    """The event with truncation applied, and the issues that reject it (if any)."""
    issues: list[EventIssue] = []
    device = event.device
    if event.consent is not None:
        issues += _misspelt_consent(event.consent)
    if isinstance(event, ConsentTransition):
        if event.consent is None:
            issues.append(EventIssue("$.consent", "a _consent_transition event needs consent"))
        # (a path alone passes, and is not stored: the pipeline leaves the page out)
        sent = event.page
        if sent is not None and (sent.url or sent.title or sent.referrer):
            issues.append(EventIssue(
                "$.page", "a _consent_transition event never carries page content"
                " (url, title or referrer): leave `page` out"
            ))
        return event, issues
    original = event.page
    if original is None:
        issues.append(EventIssue("$", "Object missing required field `page`"))
    if device is None:
        issues.append(EventIssue("$", "Object missing required field `device`"))
    if original is None or device is None:
        return event, issues
    page = _truncate(original)
    if (device.clientPlatform or "web") == "web":
        problem = _web_url_issue(original.url)
        if problem:
            issues.append(EventIssue("$.page.url", problem))
        if not original.path.startswith("/"):  # spec 2.4: a pathname on the web, a free string natively
            issues.append(EventIssue("$.page.path", "page.path must be a pathname (starting with /) for web events"))
        if not device.userAgent or device.userAgent.isspace():
            issues.append(EventIssue("$.device.userAgent", "device.userAgent is required for web events"))
        if device.viewport is None:
            issues.append(EventIssue("$.device.viewport", "device.viewport is required for web events"))
    declared: dict[str, str] = {}
    if isinstance(event, Form) and event.raw_fields is not None:
        try:
            declared = RAW_FIELDS_DECODER.decode(event.raw_fields)
        except (msgspec.DecodeError, msgspec.ValidationError):
            issues.append(
                EventIssue("$.raw_fields", "raw_fields must be a JSON object of field names to types")
            )
    if isinstance(event, Form):
        issues.extend(_field_names_in_clear(event, declared))
    if isinstance(event, Identify):
        issues.extend(_trailing_newlines(event, ("hem", "hemMd5")))
        if event.identity:
            issues.extend(_identity_in_clear(event.identity))
    if isinstance(event, Form) and event.form_submission_id is not None:
        issues.extend(_trailing_newlines(event, ("form_submission_id",)))
    if page is not original:
        event = msgspec.structs.replace(event, page=page)
    return event, issues


# Spec 2.3: `identity` carries hashed phone and ids; an address or an international
# number in clear there would be stored as sent, where rawEmail and rawPhone are sealed.
# Looked for anywhere in a string ("John <john@example.com>", "tel:+1 415 555 0123"),
# not in a Fediverse handle ("@user@mastodon.social") nor a date or an amount.
_EMAIL_IN_CLEAR = re.compile(r"(?<![@\w.+-])[\w.+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
_PHONE_IN_CLEAR = re.compile(r"(?<![\w+])\+[0-9][0-9 \u00a0()\-/]{6,22}[0-9]")
_DATE = re.compile(r"\+[0-9]{4}-[0-9]{2}-[0-9]{2}")


_URL_DECODINGS = 3  # an address encoded twice in a link's parameter is still read


def _in_clear(text: str) -> str | None:
    """What personal value `text` holds in clear, if any: as it is, or URL-encoded (a
    campaign parameter copied from a link: `john%40example.com`, `%2B14155550123`;
    helper-128), read both with `+` as itself (`encodeURI`'s "+1%20415...") and as a space
    (URLSearchParams' and GET forms' "%2B1+415+...", helper-140, helper-141)."""
    readings = [text]
    for _ in range(_URL_DECODINGS + 1):
        for reading in readings:
            if (found := _in_clear_as_it_is(reading)) is not None:
                return found
        readings = list({decoded for reading in readings if "%" in reading
                         for decoded in (unquote(reading), unquote_plus(reading)) if decoded != reading})
        if not readings:
            break
    return None


def _in_clear_as_it_is(text: str) -> str | None:
    if "@" in text and not text.lstrip().startswith("@") and _EMAIL_IN_CLEAR.search(text):
        return "an email address"
    if "+" in text:
        for match in _PHONE_IN_CLEAR.finditer(text):
            if 8 <= sum(ch.isdigit() for ch in match.group()) <= 15 and not _DATE.match(match.group()):
                return "a phone number"
    return None


def _field_names_in_clear(form: Form, declared: dict[str, str]) -> list[EventIssue]:
    """A form's field names are stored as sent, its values sealed: a name holding an email
    address or a phone number in clear (`answer[jane@example.com]`) would store it
    (helper-128). Refused, without repeating the name."""
    issues = []
    for path, names in (("$.values", form.values or ()), ("$.raw_fields", declared),
                        ("$.files", [entry.field for entry in form.files or () if entry.field])):
        for name in names:
            if (found := _in_clear(name)) is not None:
                issues.append(EventIssue(path, f"a field name holds {found} in clear: field names are stored"
                                               " as sent (only values are sealed); name the field, not the person"))
                break
    return issues


def _identity_in_clear(identity: dict[str, object]) -> list[EventIssue]:
    issues = []
    stack: list[tuple[str, object]] = [("$.identity", identity)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                stack.append((f"{path}.{key}", item))
                stack.append((f"{path}.{key} (the key)", key))  # ({"john@example.com": true})
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value))
        elif isinstance(value, str) and (found := _in_clear(value)):
            kind = "rawEmail" if found == "an email address" else "rawPhone"
            issues.append(EventIssue(path, f"{found} in clear: identity carries hashed values;"
                                           f" send it as {kind} (sealed) or its hash"))
    return sorted(issues, key=lambda issue: issue.path)
