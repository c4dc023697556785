"""The host address list, parsed in one place."""

from __future__ import annotations

from holdfast_wire import addresses


def test_one_address_or_a_comma_separated_list_blanks_dropped():
    assert addresses.parse("ws://lb:8765") == ("ws://lb:8765",)
    assert addresses.parse(" ws://a:1 , ,wss://b:2,") == ("ws://a:1", "wss://b:2")
    assert addresses.parse("") == ()


def test_only_websocket_addresses_naming_a_host_are_usable():
    assert addresses.usable("ws://a:1") and addresses.usable("wss://a")
    assert not addresses.usable("http://a:1") and not addresses.usable("ws://")


def test_the_public_form_never_shows_credentials_a_path_or_a_query():
    assert addresses.public("wss://user:secret@host:9/path?token=x") == "wss://host:9"
