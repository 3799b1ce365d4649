"""Sending one delivery: our signed JSON webhook ourselves; email and everything else via apprise."""

from __future__ import annotations

import ipaddress
import json
import socket
import time
from urllib.parse import SplitResult, quote, urlencode, urlsplit, urlunsplit

import apprise
import requests
import urllib3
from django.conf import settings
from requests.adapters import HTTPAdapter
from requests.utils import select_proxy

from .models import Channel, Delivery
from .signing import sign


class DeliveryError(Exception):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def internal_address_error(host: str | None, *, unresolved_ok: bool = False) -> str | None:
    """Refuse targets on loopback, private, link-local or reserved addresses (SSRF: a user's
    webhook must not reach Redis, the database or a cloud metadata service), unless
    NOTIFY_ALLOW_PRIVATE_TARGETS is on (a closed network, the tests' local receivers).

    ``unresolved_ok``: for a host that is no host (apprise's ``host`` of a cloud service is a token:
    Slack's ``slack://T1JJ3T3L2/…`` posts to hooks.slack.com, and "T1JJ3T3L2 does not resolve" refused
    every such channel: trial28 F6; see :func:`checked_hosts`). A host that is connected to (a webhook's,
    apprise's json://, xml://, form://, a mail server) is refused when it does not resolve: the sender
    looks it up again, and a name that failed here may then resolve to an internal address."""
    if not host or settings.NOTIFY_ALLOW_PRIVATE_TARGETS:
        return None
    try:
        addresses = host_addresses(host)
    except (OSError, UnicodeError):
        return None if unresolved_ok else f"{host} does not resolve"
    return addresses_error(host, addresses)


def host_addresses(host: str) -> list[str]:
    """``host``'s addresses in the resolver's order, once each; raises OSError when it does not resolve."""
    return list(dict.fromkeys(info[4][0] for info in socket.getaddrinfo(host.strip("[]"), None)))


def addresses_error(host: str, addresses: list[str]) -> str | None:
    """Why ``host`` may not be connected to at ``addresses`` (any one internal refuses it), or None."""
    if settings.NOTIFY_ALLOW_PRIVATE_TARGETS:
        return None
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%")[0])
        # not is_global: 100.64.0.0/10 (carrier-grade NAT: Alibaba Cloud's metadata service at
        # 100.100.100.200, Tailscale's nodes) is neither private nor reserved, and was let through.
        if ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_reserved or ip.is_multicast \
                or ip.is_unspecified or not ip.is_global:
            return f"{host} is an internal address ({ip}); set NOTIFY_ALLOW_PRIVATE_TARGETS=true to allow it"
    return None


def target_hosts(kind: str, target: str) -> list[str | None]:
    return [host for host, _ in checked_hosts(kind, target)]


def checked_hosts(kind: str, target: str) -> list[tuple[str | None, bool]]:
    """Each host of ``target`` with whether it may not resolve, i.e. is not connected to:

    - an apprise service whose URL has no ``{host}`` (slack://, discord://, pover://) keeps its first
      token there;
    - apprise's mail (``mailto://``, ``mailtos://``) connects to its SMTP server only: ``smtp_host``,
      from ``?smtp=``, a provider's template (gmail.com: smtp.gmail.com) or else the URL's host itself.
      Where the SMTP server is another host, the URL's host is the sender's mail domain, never
      connected to, and a domain with only an MX record has no address: "does not resolve" refused
      working channels. Apprise never looks MX records up (neither do we: no MX is consulted, so a
      mailto:// URL with no ``?smtp=`` needs a domain that is itself the mail server).

    Told per service: one target may hold several URLs, and a token may be spelled as another's host."""
    if kind == Channel.Kind.WEBHOOK:
        return [(urlsplit(target).hostname, False)]
    if kind == Channel.Kind.APPRISE:
        notifier = apprise.Apprise()
        notifier.add(target)
        hosts = []
        for server in notifier:
            host, smtp_host = getattr(server, "host", None), getattr(server, "smtp_host", None)
            if smtp_host:
                hosts += [(host, True)] if host and host != smtp_host else []
                hosts.append((smtp_host, False))
            else:
                hosts.append((host, "host" not in getattr(server, "template_tokens", {"host": None})))
        return hosts
    return []  # email goes through the configured SMTP server


def target_address_error(kind: str, target: str) -> str | None:
    """The first of ``target``'s hosts that :func:`internal_address_error` refuses, or None: asked when
    a channel is made and again at each send (a name may resolve elsewhere by then)."""
    for host, may_not_resolve in checked_hosts(kind, target):
        if problem := internal_address_error(host, unresolved_ok=may_not_resolve):
            if problem.endswith("does not resolve") and mail_server_is_its_domain(target, host):
                problem += (f" (mail is sent to {host} itself, the host of the mailto:// URL: name your "
                            f"mail server with ?smtp=, e.g. mailtos://user:pass@{host}?smtp=smtp.{host})")
            return problem
    return None


def mail_server_is_its_domain(target: str, host: str | None) -> bool:
    """Whether one of ``target``'s apprise mail URLs connects to its own host (no ``?smtp=`` nor template)."""
    notifier = apprise.Apprise()
    notifier.add(target)
    return any(getattr(server, "smtp_host", None) == host == getattr(server, "host", None) for server in notifier)


def send(delivery: Delivery) -> int | None:
    """Send or raise DeliveryError; returns the HTTP status for webhooks."""
    channel = delivery.channel
    if channel.kind == Channel.Kind.WEBHOOK:
        return send_webhook(delivery)
    # apprise (and smtplib under it) looks each host up again after this check, and a name under an
    # attacker's DNS may answer differently the second time (DNS rebinding): not pinned, because each
    # apprise plugin makes its own connection (requests, smtplib, SDKs) and takes no address. What this
    # check does hold: a host that resolves, now, to an internal address, or not at all, is not sent to.
    # What it does not: a public answer here followed by an internal one in apprise's own lookup
    # (docs/notifications.md "DNS rebinding"; an egress firewall on the notify worker closes it).
    if problem := target_address_error(channel.kind, channel.target):
        raise DeliveryError(problem)
    title = f"[yoloportal] {delivery.payload.get('message', delivery.event)}"
    url = email_url(channel.target) if channel.kind == Channel.Kind.EMAIL else channel.target
    notifier = apprise.Apprise()
    if not notifier.add(url):
        raise DeliveryError("the channel's target is not a URL apprise can send to")
    if not notifier.notify(title=title, body=text_body(delivery.payload)):
        if channel.kind == Channel.Kind.EMAIL:
            # Said where it went: a manager reads this, not the worker's log (manager trial).
            raise DeliveryError(f"the mail server {settings.NOTIFY_SMTP_HOST}:{settings.NOTIFY_SMTP_PORT} "
                                f"(NOTIFY_SMTP_HOST, NOTIFY_SMTP_PORT) did not take the mail: ask the "
                                f"operator whether mail is set up")
        raise DeliveryError(f"{channel.kind} delivery failed (apprise reported failure; see the worker log)")
    return None


def body_bytes(payload: dict) -> bytes:
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()


class PinnedAdapter(HTTPAdapter):
    """Connects where the URL says (an IP address) while TLS speaks to, and verifies the certificate
    against, ``hostname``: SNI and the name checked are the host the user wrote, not the address."""

    def __init__(self, hostname: str) -> None:
        super().__init__(max_retries=0)
        self.hostname = hostname

    def build_connection_pool_key_attributes(self, request, verify, cert=None):
        host_params, pool_kwargs = super().build_connection_pool_key_attributes(request, verify, cert)
        if host_params["scheme"] == "https":
            pool_kwargs = {**pool_kwargs, "server_hostname": self.hostname, "assert_hostname": self.hostname}
        return host_params, pool_kwargs


def pinned(prepared: requests.PreparedRequest, parts: SplitResult, address: str) -> requests.PreparedRequest:
    """``prepared`` sent to ``address`` (checked), with the ``Host`` header of the URL it was for."""
    attempt = prepared.copy()
    address = address.replace("%", "%25")
    literal = f"[{address}]" if ":" in address else address
    host = parts.netloc.rpartition("@")[2]  # as http.client writes it: no default port
    default_port = {"http": 80, "https": 443}.get(parts.scheme)
    attempt.headers["Host"] = host.rsplit(":", 1)[0] if parts.port == default_port else host
    attempt.url = urlunsplit(parts._replace(netloc=literal if parts.port is None else f"{literal}:{parts.port}"))
    return attempt


def not_connected(exc: requests.RequestException) -> bool:
    """Whether ``exc`` is a connection that was never made (refused, unreachable, timed out connecting)."""
    reason = getattr(exc.args[0], "reason", None) if exc.args else None
    return isinstance(exc, requests.ConnectTimeout) or isinstance(reason, urllib3.exceptions.ConnectTimeoutError)


def send_webhook(delivery: Delivery) -> int:
    """Post the signed body to the address that was checked.

    1. Prepare the request as requests would (the host IDNA-encoded, auth from the URL in a header).
    2. Look the host up once and refuse it if any address is internal (:func:`addresses_error`).
    3. Send to the first address (the next one where no connection was made), with the original
       ``Host`` header, and for https the hostname as SNI and as the name the certificate must carry.
       Looking the name up again here would let a DNS answer that changed since step 2 (rebinding)
       reach an internal address. The addresses share one ``NOTIFY_TIMEOUT_S`` to connect: each is
       given an even part of what is left of it (urllib3 gave each address the whole timeout, so a
       name whose every address drops connections took it once per address, past the delivery
       task's stop at 3 × it + 30 s; the whole of what was left let a first address that drops its
       SYNs, an AAAA without a route, leave the working next one no time at all: review30). The
       address that took the connection has the whole timeout to answer: at most 2 × it in all.
    Through an HTTP(S)_PROXY from the environment the proxy connects, with its own lookup: the
    request goes unpinned to it, as before (the proxy is the operator's egress control)."""
    body = body_bytes({**delivery.payload, "delivery": delivery.pk})
    timestamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "yoloportal-webhook/1",
        "X-Yoloportal-Event": delivery.event,
        "X-Yoloportal-Delivery": str(delivery.pk),
        "X-Yoloportal-Timestamp": str(timestamp),
        "X-Yoloportal-Signature": sign(delivery.channel.secret, timestamp, body),
    }
    with requests.Session() as session:
        try:
            prepared = session.prepare_request(requests.Request("POST", delivery.channel.target, data=body,
                                                                headers=headers))
        except requests.RequestException as exc:
            raise DeliveryError(f"webhook unreachable: {exc}") from None
        environment = session.merge_environment_settings(prepared.url, {}, None, None, None)
        parts = urlsplit(prepared.url)
        hostname = parts.hostname or ""
        try:
            addresses = host_addresses(hostname)
        except (OSError, UnicodeError):
            raise DeliveryError(f"{hostname} does not resolve") from None
        if problem := addresses_error(hostname, addresses):
            raise DeliveryError(problem)
        if select_proxy(prepared.url, environment["proxies"]):
            attempts = [prepared]
        else:
            session.mount(f"{parts.scheme}://", PinnedAdapter(hostname))
            attempts = [pinned(prepared, parts, address) for address in addresses]
        deadline = time.monotonic() + settings.NOTIFY_TIMEOUT_S
        for number, attempt in enumerate(attempts, 1):
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                raise DeliveryError(f"webhook unreachable: no connection to {hostname} within NOTIFY_TIMEOUT_S "
                                    f"({settings.NOTIFY_TIMEOUT_S:g} s; {number - 1} of its {len(attempts)} "
                                    "addresses tried)")
            connect_s = left_s / (len(attempts) - number + 1)
            try:
                response = session.send(attempt, timeout=(connect_s, settings.NOTIFY_TIMEOUT_S),
                                        allow_redirects=False, **environment)
                break
            except requests.RequestException as exc:
                # The next checked address when this one took no connection (nothing was sent), as
                # urllib3 tried each address of its own lookup: a name with a dead first address
                # (an unreachable AAAA, a receiver down behind round-robin DNS) was no longer reached.
                if number < len(attempts) and not_connected(exc):
                    continue
                if len(attempts) > 1 and not_connected(exc):
                    raise DeliveryError(f"webhook unreachable: no connection to {hostname} at any of its "
                                        f"{len(attempts)} addresses within NOTIFY_TIMEOUT_S "
                                        f"({settings.NOTIFY_TIMEOUT_S:g} s): {exc}") from None
                raise DeliveryError(f"webhook unreachable: {exc}") from None
    if not 200 <= response.status_code < 300:
        raise DeliveryError(f"webhook answered HTTP {response.status_code}", status=response.status_code)
    return response.status_code


def text_body(payload: dict) -> str:
    lines = [payload.get("message", "")]
    job = payload.get("job")
    if job:
        lines += [f"Job: {job['task_name']} ({job['id']})", f"Team: {job['team']}, user: {job['user']}",
                  f"State: {job['state']}, attempt {job['attempt']}"]
        if job.get("error"):
            lines.append(f"Error: {job['error']}")
    if payload.get("url"):
        lines.append(payload["url"])
    return "\n".join(lines)


def email_url(address: str) -> str:
    """An apprise mail URL for one recipient through the configured SMTP server."""
    secure = settings.NOTIFY_SMTP_SECURITY
    auth = ""
    if settings.NOTIFY_SMTP_USER:
        auth = f"{quote(settings.NOTIFY_SMTP_USER, safe='')}:{quote(settings.NOTIFY_SMTP_PASSWORD, safe='')}@"
    query = urlencode({"smtp": settings.NOTIFY_SMTP_HOST, "from": settings.NOTIFY_FROM, "to": address,
                       "mode": secure})
    scheme = "mailto" if secure == "insecure" else "mailtos"
    return f"{scheme}://{auth}{settings.NOTIFY_SMTP_HOST}:{settings.NOTIFY_SMTP_PORT}?{query}"
