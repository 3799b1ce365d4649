"""A webhook is posted to the address its host was checked at, not to whatever a second lookup says.

DNS is played by a stand-in ``socket.getaddrinfo`` for the one name under test, and the public
internet by a stand-in for urllib3's connect that sends a connection to 93.184.215.14 to a local
receiver (a connection urllib3 makes to the name itself is not redirected: the unpinned sender's
https post goes nowhere here). The sender, requests, urllib3 and TLS are the real ones."""

from __future__ import annotations

import socket

import pytest
import urllib3.util.connection

from apps.notifications.models import Channel
from apps.notifications.services import channel_test

from .receivers import WebhookReceiver, tls_for

pytestmark = pytest.mark.django_db

HOST, PUBLIC = "hooks.example.org", "93.184.215.14"


def dns(monkeypatch, answers: list[str]) -> list[str]:
    """``HOST`` answers each of ``answers`` in turn (the last one from then on); returns what was asked."""
    real, asked = socket.getaddrinfo, []

    def getaddrinfo(host, port, *args, **kwargs):
        if host != HOST:
            return real(host, port, *args, **kwargs)
        asked.append(host)
        address = answers.pop(0) if len(answers) > 1 else answers[0]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port or 0))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return asked


def internet(monkeypatch, public_port: int) -> None:
    """A connection to ``PUBLIC`` reaches the local receiver on ``public_port`` instead."""
    real = urllib3.util.connection.create_connection

    def create_connection(address, *args, **kwargs):
        if address[0] == PUBLIC:
            address = ("127.0.0.1", public_port)
        return real(address, *args, **kwargs)

    monkeypatch.setattr(urllib3.util.connection, "create_connection", create_connection)


@pytest.fixture
def public_server():
    server = WebhookReceiver().start()
    yield server
    server.stop()


def test_a_webhook_whose_name_rebinds_after_the_check_is_posted_to_the_checked_address(
    bob, receiver, public_server, settings, monkeypatch
):
    """The check saw a public address; a second lookup (requests' own) answered 127.0.0.1, where
    ``receiver`` plays Redis on the URL's port, and got the post (DNS rebinding)."""
    settings.NOTIFY_ALLOW_PRIVATE_TARGETS = False
    dns(monkeypatch, [PUBLIC, "127.0.0.1"])
    internet(monkeypatch, public_server.port)
    channel = Channel.objects.create(
        user=bob, name="hook", kind=Channel.Kind.WEBHOOK, target=f"http://{HOST}:{receiver.port}/hook"
    )
    delivery = channel_test(channel=channel, by=bob)
    assert delivery.state == "sent", delivery.last_error
    assert receiver.received == []
    [post] = public_server.received
    assert post.headers["host"] == f"{HOST}:{receiver.port}"
    assert post.path == "/hook" and post.headers["x-yoloportal-event"] == "test"


def test_a_name_that_resolves_inside_at_send_time_is_refused_without_a_second_lookup(
    bob, receiver, settings, monkeypatch
):
    settings.NOTIFY_ALLOW_PRIVATE_TARGETS = False
    asked = dns(monkeypatch, ["127.0.0.1", PUBLIC])
    channel = Channel.objects.create(
        user=bob, name="hook", kind=Channel.Kind.WEBHOOK, target=f"http://{HOST}:{receiver.port}/hook"
    )
    delivery = channel_test(channel=channel, by=bob)
    assert delivery.state == "failed" and "internal address (127.0.0.1)" in delivery.last_error
    assert asked == [HOST] and receiver.received == []


@pytest.fixture
def tls_server(tmp_path, monkeypatch):
    """An https receiver whose certificate names ``HOST``, its CA trusted the way an operator would
    (REQUESTS_CA_BUNDLE); each test starts it with the host its certificate names."""

    def start(hostname: str):
        context, ca, asked = tls_for(hostname, tmp_path)
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca))
        server = WebhookReceiver().start(tls=context)
        started.append(server)
        return server, asked

    started = []
    yield start
    for server in started:
        server.stop()


def test_a_pinned_https_webhook_still_sends_the_hostname_as_sni_and_verifies_it(bob, tls_server, settings, monkeypatch):
    settings.NOTIFY_ALLOW_PRIVATE_TARGETS = False
    server, sni = tls_server(HOST)
    dns(monkeypatch, [PUBLIC])
    internet(monkeypatch, server.port)
    channel = Channel.objects.create(
        user=bob, name="hook", kind=Channel.Kind.WEBHOOK, target=f"https://{HOST}:{server.port}/hook"
    )
    delivery = channel_test(channel=channel, by=bob)
    assert delivery.state == "sent", delivery.last_error
    assert sni == [HOST]
    assert server.received[0].headers["host"] == f"{HOST}:{server.port}"


def test_a_pinned_https_webhook_refuses_a_certificate_for_another_name(bob, tls_server, settings, monkeypatch):
    """Connecting to an address must not turn certificate checking off or check it against the address."""
    settings.NOTIFY_ALLOW_PRIVATE_TARGETS = False
    server, _ = tls_server("other.example.org")
    dns(monkeypatch, [PUBLIC])
    internet(monkeypatch, server.port)
    channel = Channel.objects.create(
        user=bob, name="hook", kind=Channel.Kind.WEBHOOK, target=f"https://{HOST}:{server.port}/hook"
    )
    delivery = channel_test(channel=channel, by=bob)
    assert delivery.state == "failed" and "webhook unreachable" in delivery.last_error
    assert HOST in delivery.last_error and server.received == []


def test_a_name_that_resolves_to_shared_address_space_is_refused(bob, receiver, settings, monkeypatch):
    """100.64.0.0/10 (carrier-grade NAT) is neither private nor reserved to ``ipaddress``, but it is
    no public address: Alibaba Cloud serves its instance metadata at 100.100.100.200."""
    settings.NOTIFY_ALLOW_PRIVATE_TARGETS = False
    dns(monkeypatch, ["100.100.100.200"])
    channel = Channel.objects.create(
        user=bob, name="hook", kind=Channel.Kind.WEBHOOK, target=f"http://{HOST}:{receiver.port}/hook"
    )
    delivery = channel_test(channel=channel, by=bob)
    assert delivery.state == "failed" and "internal address (100.100.100.200)" in delivery.last_error
    assert receiver.received == []


def test_a_redirect_to_an_internal_address_is_not_followed(bob, receiver, public_server, settings, monkeypatch):
    """The checked, public receiver answers 307 to 127.0.0.1 (where ``receiver`` plays Redis): the
    pinned post stops there, a failed delivery; a followed redirect would reach the unchecked address."""
    settings.NOTIFY_ALLOW_PRIVATE_TARGETS = False
    dns(monkeypatch, [PUBLIC])
    internet(monkeypatch, public_server.port)
    public_server.statuses, public_server.location = [307], receiver.url
    channel = Channel.objects.create(
        user=bob, name="hook", kind=Channel.Kind.WEBHOOK, target=f"http://{HOST}:{public_server.port}/hook"
    )
    delivery = channel_test(channel=channel, by=bob)
    assert delivery.state == "failed" and "HTTP 307" in delivery.last_error
    assert len(public_server.received) == 1 and receiver.received == []


def routed(monkeypatch, routes: dict[str, int]) -> list[str]:
    """``HOST`` answers the public addresses of ``routes`` in their order, and a connection to each
    reaches the local port it maps to; returns the addresses connected to, in order."""
    real_getaddrinfo, real_connect, connects = socket.getaddrinfo, urllib3.util.connection.create_connection, []

    def getaddrinfo(host, port, *args, **kwargs):
        if host != HOST:
            return real_getaddrinfo(host, port, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port or 0)) for address in routes]

    def create_connection(address, *args, **kwargs):
        if address[0] in routes:
            connects.append(address[0])
            address = ("127.0.0.1", routes[address[0]])
        return real_connect(address, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(urllib3.util.connection, "create_connection", create_connection)
    return connects


@pytest.fixture
def dropping_port():
    """A local port that answers no connection (its SYNs dropped: a listener whose accept queue is
    full stands in for a firewall that drops them, or an AAAA without a route)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    queued = []
    for _ in range(3):  # fill its accept queue: further connections get no answer
        client = socket.socket()
        client.setblocking(False)
        client.connect_ex(("127.0.0.1", port))
        queued.append(client)
    yield port
    for client in queued:
        client.close()
    listener.close()


def test_a_name_whose_first_address_takes_no_connection_is_posted_to_its_next(
    bob, public_server, settings, monkeypatch
):
    """Two public answers, the first refusing connections (a receiver down behind round-robin DNS, an
    AAAA without a route): urllib3 tried each address of its lookup, the pinned post must too."""
    settings.NOTIFY_ALLOW_PRIVATE_TARGETS = False
    with socket.socket() as closed:  # a local port nothing listens on
        closed.bind(("127.0.0.1", 0))
        dead_port = closed.getsockname()[1]
    routed(monkeypatch, {"93.184.215.15": dead_port, PUBLIC: public_server.port})
    channel = Channel.objects.create(
        user=bob, name="hook", kind=Channel.Kind.WEBHOOK, target=f"http://{HOST}:{public_server.port}/hook"
    )
    delivery = channel_test(channel=channel, by=bob)
    assert delivery.state == "sent", delivery.last_error
    [post] = public_server.received
    assert post.headers["host"] == f"{HOST}:{public_server.port}"


def test_a_name_whose_every_address_takes_no_connection_fails_within_one_timeout(
    bob, dropping_port, settings, monkeypatch
):
    """Four public answers, none accepting a connection: each address was given NOTIFY_TIMEOUT_S of
    its own, four timeouts in all, past the delivery task's stop (3 × the timeout + 30 s) with a few
    more. The whole delivery has one NOTIFY_TIMEOUT_S to connect now."""
    import time

    settings.NOTIFY_ALLOW_PRIVATE_TARGETS = False
    settings.NOTIFY_TIMEOUT_S = 1.0
    blackholed = [f"93.184.215.{n}" for n in range(20, 24)]
    connects = routed(monkeypatch, dict.fromkeys(blackholed, dropping_port))
    channel = Channel.objects.create(user=bob, name="hook", kind=Channel.Kind.WEBHOOK, target=f"http://{HOST}/hook")
    began = time.monotonic()
    delivery = channel_test(channel=channel, by=bob)
    took = time.monotonic() - began
    assert took < 2.5, (took, connects)  # one timeout of 1 s (four before)
    assert delivery.state == "failed"
    assert "NOTIFY_TIMEOUT_S" in delivery.last_error and HOST in delivery.last_error, delivery.last_error
    assert connects and connects == blackholed[: len(connects)]  # tried in the resolver's order


def test_a_name_whose_first_address_drops_connections_is_still_posted_to_its_next(
    bob, public_server, dropping_port, settings, monkeypatch
):
    """An AAAA without a route drops its SYNs (the case the next address is tried for): the first
    address must not be given the whole shared NOTIFY_TIMEOUT_S, or the working second one is never
    tried and every delivery fails (review30: 'no connection ... 1 of its 2 addresses tried')."""
    settings.NOTIFY_ALLOW_PRIVATE_TARGETS = False
    settings.NOTIFY_TIMEOUT_S = 1.0
    connects = routed(monkeypatch, {"93.184.215.20": dropping_port, PUBLIC: public_server.port})
    channel = Channel.objects.create(
        user=bob, name="hook", kind=Channel.Kind.WEBHOOK, target=f"http://{HOST}:{public_server.port}/hook"
    )
    delivery = channel_test(channel=channel, by=bob)
    assert delivery.state == "sent", delivery.last_error
    assert connects == ["93.184.215.20", PUBLIC]
    [post] = public_server.received
    assert post.headers["host"] == f"{HOST}:{public_server.port}"
