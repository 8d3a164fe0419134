"""Client load for a chaos run: chat completions through the official ``openai`` client, and
placements and deletions through the HTTP API, each through a randomly chosen node.

Chat workers loop until stopped: a greedy (``temperature`` 0) completion of one of
:data:`PROMPTS`, streamed or plain by a coin flip, through any node, including one that is
down or stopped right now (the client sees what a user would). One more worker streams
:data:`LONG_TOKENS` tokens at a time, so faults catch streams in flight. The control worker
keeps the
cluster between one and :data:`MAX_INSTANCES` instances of the demo model: it places one
when a node's ``/v1/instances`` lists fewer, deletes a random listed one otherwise (and
sometimes anyway). Nothing here
retries: every attempt is one :class:`~skulk.chaos._history.Op`. The client's own timeout is
well past the run's request deadline, so a hang is recorded as ``timeout`` instead of holding
a worker forever.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable

import httpx
import openai

from skulk.chaos._history import History, Op

MODEL = "skulk-demo"
PROMPTS = ("Tell me about foxes.", "Where do badgers live?", "Sing of the river.")
MAX_TOKENS = 16
#: The long streams: in flight for a while, so faults catch them mid-stream.
LONG_TOKENS = 256
MAX_INSTANCES = 2
CONNECT_TIMEOUT = 5.0
#: Seconds between a worker's requests, and between control commands.
CHAT_PAUSE = (0.05, 0.4)
CONTROL_PAUSE = (2.0, 6.0)


def _error_code(body: object) -> str | None:
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and isinstance(err.get("code"), str):
            return str(err["code"])
    return None


class Load:
    """The load threads of one run; ``urls()`` are the nodes' API URLs by index (1-based, all
    of them: down or not), ``client_timeout`` the seconds a client waits for any one read."""

    def __init__(
        self,
        history: History,
        urls: Callable[[], list[str]],
        *,
        seed: int,
        chat_workers: int,
        long_workers: int = 1,
        client_timeout: float,
    ) -> None:
        self.history = history
        self.urls = urls
        self.client_timeout = client_timeout
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._chat_loop, name=f"chaos-chat-{i}", daemon=True)
            for i in range(chat_workers)
        ]
        self._threads += [
            threading.Thread(target=self._long_loop, name=f"chaos-long-{i}", daemon=True)
            for i in range(long_workers)
        ]
        self._threads.append(threading.Thread(target=self._control_loop, daemon=True))

    def _pick(self) -> tuple[int, str]:
        urls = self.urls()
        with self._rng_lock:
            i = self._rng.randrange(len(urls))
        return i + 1, urls[i]

    def _draw(self, f: Callable[[random.Random], float]) -> float:
        with self._rng_lock:
            return f(self._rng)

    def place_first(self, budget: float) -> bool:
        """Place the first instance, retrying until acknowledged or ``budget`` is spent; every
        attempt goes into the history (a 503 may have committed). Whether one was
        acknowledged."""
        end = time.monotonic() + budget
        while time.monotonic() < end:
            op = self.place()
            self.history.add(op)
            if op.outcome == "ok":
                return True
            time.sleep(1.0)
        return False

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            if t.is_alive():
                t.join(self.client_timeout + 30)

    # -- chat -------------------------------------------------------------------------------

    def _chat_loop(self) -> None:
        while not self._stop.is_set():
            node, url = self._pick()
            stream = self._draw(lambda r: r.random()) < 0.5
            prompt = int(self._draw(lambda r: r.randrange(len(PROMPTS))))
            self.history.add(self.chat(node, url, prompt, stream=stream))
            self._stop.wait(self._draw(lambda r: r.uniform(*CHAT_PAUSE)))

    def _long_loop(self) -> None:
        while not self._stop.is_set():
            node, url = self._pick()
            prompt = int(self._draw(lambda r: r.randrange(len(PROMPTS))))
            self.history.add(self.chat(node, url, prompt, stream=True, max_tokens=LONG_TOKENS))
            self._stop.wait(self._draw(lambda r: r.uniform(*CHAT_PAUSE)))

    def chat(
        self, node: int, url: str, prompt: int, *, stream: bool, max_tokens: int = MAX_TOKENS
    ) -> Op:
        """One completion of ``PROMPTS[prompt]`` through ``url``, as an op."""
        client = openai.OpenAI(
            base_url=url + "/v1",
            api_key="chaos",
            max_retries=0,
            timeout=openai.Timeout(self.client_timeout, connect=CONNECT_TIMEOUT),
        )
        kind = "stream" if stream else "chat"
        messages: list[openai.types.chat.ChatCompletionMessageParam] = [
            {"role": "user", "content": PROMPTS[prompt]}
        ]
        request_id = f"chaos-{uuid.uuid4().hex}"
        headers = {"x-request-id": request_id}
        start = time.monotonic()
        text: list[str] = []

        def op(outcome: str, **kw: object) -> Op:
            return Op(kind, node, start, time.monotonic(), outcome, prompt=prompt,  # type: ignore[arg-type]
                      text="".join(text), max_tokens=max_tokens, request_id=request_id,
                      **kw)  # type: ignore[arg-type]  # fmt: skip

        try:
            if not stream:
                reply = client.chat.completions.create(
                    model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0,
                    extra_headers=headers,
                )
                text.append(reply.choices[0].message.content or "")
                return op("ok", status=200)
            finished = None
            with client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0, stream=True,
                extra_headers=headers,
            ) as chunks:
                for chunk in chunks:
                    for choice in chunk.choices:
                        text.append(choice.delta.content or "")
                        finished = choice.finish_reason or finished
            if finished is None:
                return op("truncated", status=200, detail="no finish_reason and no error event")
            return op("ok", status=200)
        except openai.APITimeoutError as exc:
            return op("timeout", code="APITimeoutError", detail=str(exc)[:200])
        except openai.APIConnectionError as exc:
            return op("unreachable", code=type(exc.__cause__ or exc).__name__,
                      detail=str(exc.__cause__ or exc)[:200])  # fmt: skip
        except openai.APIStatusError as exc:
            return op("error", status=exc.status_code, code=_error_code(exc.body),
                      detail=exc.message[:200])  # fmt: skip
        except openai.APIError as exc:  # an error event in a stream
            return op("error", status=200, code=_error_code(exc.body) or "stream_error",
                      detail=exc.message[:200])  # fmt: skip
        finally:
            client.close()

    # -- control ----------------------------------------------------------------------------

    def _control_loop(self) -> None:
        while not self._stop.wait(self._draw(lambda r: r.uniform(*CONTROL_PAUSE))):
            listed = self._listed()
            if listed is None:
                continue  # no node answered: nothing to decide on
            delete = len(listed) >= MAX_INSTANCES or (
                len(listed) > 1 and self._draw(lambda r: r.random()) < 0.3
            )
            if delete:
                with self._rng_lock:
                    victim = self._rng.choice(listed)
                self.history.add(self.delete(victim))
            else:
                self.history.add(self.place())

    def _listed(self) -> list[str] | None:
        """The instance ids of the demo model as some node's State has them now."""
        _, url = self._pick()
        r, _ = self._http("GET", url + "/v1/instances")
        try:
            assert r is not None and r.status_code == 200
            items = r.json()["instances"]
            return sorted(str(i["id"]) for i in items if i.get("model") == MODEL)
        except (AssertionError, ValueError, KeyError, TypeError):
            return None

    def _http(
        self, method: str, url: str, body: object = None
    ) -> tuple[httpx.Response | None, str]:
        try:
            timeout = httpx.Timeout(self.client_timeout, connect=CONNECT_TIMEOUT)
            return httpx.request(method, url, json=body, timeout=timeout), ""
        except httpx.TimeoutException as exc:
            return None, f"timeout:{type(exc).__name__}: {exc}"
        except httpx.HTTPError as exc:
            return None, f"{type(exc).__name__}: {exc}"

    def _control_op(
        self, kind: str, node: int, start: float, r: httpx.Response | None, problem: str,
        instance: str | None,
    ) -> Op:  # fmt: skip
        end = time.monotonic()
        if r is None:
            outcome = "timeout" if problem.startswith("timeout:") else "unreachable"
            return Op(kind, node, start, end, outcome, code=problem.split(":")[0],  # type: ignore[arg-type]
                      detail=problem[:200], instance=instance)  # fmt: skip
        try:
            body: object = r.json()
        except ValueError:
            body = r.text
        if r.status_code in (200, 201):
            return Op(kind, node, start, end, "ok", status=r.status_code, instance=instance)  # type: ignore[arg-type]
        return Op(kind, node, start, end, "error", status=r.status_code,  # type: ignore[arg-type]
                  code=_error_code(body), detail=str(body)[:200], instance=instance)  # fmt: skip

    def place(self) -> Op:
        node, url = self._pick()
        start = time.monotonic()
        r, problem = self._http("POST", url + "/v1/placements", {"model": MODEL})
        instance = None
        if r is not None and r.status_code == 201:
            try:
                instance = str(r.json()["instance"]["id"])
            except (ValueError, KeyError, TypeError):
                instance = None
        return self._control_op("place", node, start, r, problem, instance)

    def delete(self, instance: str) -> Op:
        node, url = self._pick()
        start = time.monotonic()
        r, problem = self._http("DELETE", url + f"/v1/instances/{instance}")
        return self._control_op("delete", node, start, r, problem, instance)
