"""A server's model list (`rubric_core.server_models`), from the loopback OpenAI server."""

from __future__ import annotations

from browser_support import free_port
from openai_server import FakeOpenAI

from rubric_core.server_models import list_server_models


def test_the_model_list_is_read_and_the_key_sent_only_when_given() -> None:
    with FakeOpenAI() as server:
        server.models = ["llama3.1:8b", "qwen2.5", "llama3.1:8b"]
        found = list_server_models(server.base_url)
        assert found.models == ("llama3.1:8b", "qwen2.5") and found.problem is None
        list_server_models(server.base_url + "/", api_key="sk-for-this-server")
        assert server.models_auth == [None, "Bearer sk-for-this-server"]


def test_a_server_without_a_list_gives_a_reason_not_an_error() -> None:
    with FakeOpenAI() as server:  # models unset: GET /v1/models is a 404
        assert "HTTP 404" in (list_server_models(server.base_url).problem or "")
    dead = list_server_models(f"http://127.0.0.1:{free_port()}/v1", timeout_s=1)
    assert dead.models == () and "did not answer" in (dead.problem or "")
    assert "http://" in (list_server_models("ftp://x/v1").problem or "")
