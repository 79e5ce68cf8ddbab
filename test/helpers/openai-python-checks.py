"""Calls the server with the official openai-python as its users write them, and prints one JSON object:
each check's name with what came back ({"ok": ...}) or the exception it raised ({"error": {...}}).
Images go to files in the output folder, named in the results, for the test to decode.
test/openai-python.test.ts runs it once per openai-python version and asserts on the results.

Its argument: a JSON file with baseURL, key, limitedKey (a key allowed 2 images a minute), damaged (a
model whose graph was cut short after the server found it), work (a folder
holding in.png, mask.png, in.jpg), out (a folder for the images), and docs (docs/api.md's Python examples).
"""

import asyncio
import base64
import contextlib
import io
import json
import os
import pathlib
import sys
import threading
import time

import openai
from openai import AsyncOpenAI, OpenAI

config = json.load(open(sys.argv[1]))
BASE, KEY, WORK, OUT = config["baseURL"], config["key"], config["work"], config["out"]
results = {}


def image_file(path):
    return open(os.path.join(WORK, path), "rb")


def image_bytes(path):
    with image_file(path) as f:
        return f.read()


def save(name, data):
    """Writes an image's bytes for the test to decode; returns the file's name."""
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
    return name


def saved(name, response):
    """The images of an ImagesResponse saved as name-0, name-1, ... (b64_json decoded, a url fetched)."""
    files = []
    for i, image in enumerate(response.data):
        data = base64.b64decode(image.b64_json) if image.b64_json else openai.DefaultHttpxClient().get(image.url).content
        files.append(save(f"{name}-{i}", data))
    return files


def described(err):
    """What a user reads off an exception the SDK raised."""
    described = {"class": type(err).__name__, "message": str(err)[:300]}
    if isinstance(err, openai.APIError):
        described.update(code=err.code, param=err.param, type=err.type, body=err.body)
    if isinstance(err, openai.APIStatusError):
        headers = err.response.headers
        described.update(
            status=err.status_code,
            request_id=err.request_id,
            retry_after=headers.get("retry-after"),
            should_retry=headers.get("x-should-retry"),
        )
    return described


def check(name, run):
    try:
        results[name] = {"ok": run()}
    except Exception as err:  # every outcome is a result: the test says which were expected
        results[name] = {"error": described(err)}


class Sent:
    """The requests a client sent and the statuses it got, through its httpx client's event hooks."""

    def __init__(self):
        self.requests, self.statuses = [], []

    def client(self, **options):
        hooks = {"request": [self.request], "response": [self.response]}
        return OpenAI(base_url=BASE, http_client=openai.DefaultHttpxClient(event_hooks=hooks), **{"api_key": KEY, **options})

    def request(self, request):
        self.requests.append({"retry": request.headers.get("x-stainless-retry-count"), "bytes": len(request.read())})

    def response(self, response):
        self.statuses.append([response.status_code, response.headers.get("retry-after")])


client = OpenAI(base_url=BASE, api_key=KEY)
strict = OpenAI(base_url=BASE, api_key=KEY, _strict_response_validation=True)
settings = lambda r: {k: v for k, v in r.model_dump(exclude={"data"}).items() if v is not None}

# Generations.
check("url", lambda: saved("url", client.images.generate(model="dall-e-2", prompt="a red circle", size="256x256")))
for n in range(1, 5):
    check(f"n{n}", lambda n=n: saved(f"n{n}", client.images.generate(model="dall-e-2", prompt="a red circle", size="256x256", n=n, response_format="b64_json")))
sizes = client.models.retrieve("demo-shapes").model_extra["sizes"]
results["sizes"] = {"ok": sizes}
for size in sizes:
    check(f"size {size}", lambda size=size: saved(f"size-{size}", client.images.generate(model="dall-e-3", prompt="a blue square", size=size, quality="low", response_format="b64_json")))
for quality in ["standard", "hd", "low", "medium", "high", "xhigh", "max", "auto"]:
    check(f"quality {quality}", lambda quality=quality: len(client.images.generate(model="dall-e-2", prompt="a red circle", size="256x256", quality=quality).data))
for fmt in ["png", "jpeg", "webp"]:
    check(
        f"format {fmt}",
        lambda fmt=fmt: (lambda r: {"files": saved(f"format-{fmt}", r), "settings": settings(r)})(
            strict.images.generate(
                model="gpt-image-1", prompt="a green triangle", size="1024x1024", quality="low", output_format=fmt,
                output_compression=None if fmt == "png" else 40, background="opaque", moderation="low", user="user-1",
            )
        ),
    )
check("auto size, strict", lambda: settings(strict.images.generate(model="gpt-image-1", prompt="a red circle", quality="low")))
check("transparent", lambda: client.images.generate(model="gpt-image-1", prompt="x", background="transparent"))
check(
    "seed",
    lambda: len({client.images.generate(model="dall-e-2", prompt="a red circle", size="256x256", response_format="b64_json", extra_body={"seed": 7, "steps": 2}).data[0].b64_json for _ in range(2)}),
)
check("nulls", lambda: len(client.images.generate(model="dall-e-3", prompt="x", size="256x256", n=None, quality=None, style=None, response_format=None).data))

# Edits and variations: every way the SDK takes a file.
ways = {
    "file": lambda: image_file("in.png"),
    "tuple": lambda: ("in.png", image_bytes("in.png"), "image/png"),
    "octet-stream tuple": lambda: ("in.png", image_bytes("in.png"), "application/octet-stream"),
    "bytes": lambda: image_bytes("in.png"),
    "BytesIO": lambda: io.BytesIO(image_bytes("in.png")),
    "Path": lambda: pathlib.Path(WORK, "in.png"),
    "list of one": lambda: [image_file("in.png")],
}
for way, image in ways.items():
    check(f"edit {way}", lambda way=way, image=image: saved(f"edit-{way}", client.images.edit(model="dall-e-2", image=image(), prompt="a red circle", size="256x256", response_format="b64_json")))
check(
    "edit mask",
    lambda: (lambda r: {"files": saved("edit-mask", r), "settings": settings(r)})(
        strict.images.edit(model="gpt-image-1", image=image_file("in.png"), mask=image_file("mask.png"), prompt="a red circle", input_fidelity="high", quality="low", output_format="webp", n=2)
    ),
)
check("edit several", lambda: client.images.edit(model="gpt-image-1", image=[image_file("in.png"), image_file("in.jpg")], prompt="x"))
check("edit not an image", lambda: client.images.edit(image=("notes.txt", b"hello", "text/plain"), prompt="x"))
check("edit mask of another size", lambda: client.images.edit(model="dall-e-2", image=image_file("in.png"), mask=image_file("in.jpg"), prompt="x"))
check("variation", lambda: saved("variation", client.images.create_variation(image=image_file("in.png"), n=3, size="256x256", response_format="b64_json", user="user-1")))
check("variation jpeg", lambda: saved("variation-jpeg", client.images.create_variation(image=("in.jpg", image_bytes("in.jpg"), "image/jpeg"), size="256x256", response_format="b64_json")))


# Streaming: each event as the SDK types it.
def streamed(name, stream, instances):
    events = []
    for event in stream:
        b64 = getattr(event, "b64_json", None)
        events.append({
            "class": type(event).__name__,
            "instance": any(isinstance(event, kind) for kind in instances),
            "type": event.type,
            "index": getattr(event, "partial_image_index", None),
            "size": getattr(event, "size", None),
            "extra": event.model_extra or {},
            "file": save(f"{name}-{len(events)}", base64.b64decode(b64)) if b64 else None,
        })
    return events


types = openai.types
generated = (types.ImageGenPartialImageEvent, types.ImageGenCompletedEvent)
edited = (types.ImageEditPartialImageEvent, types.ImageEditCompletedEvent)
for partials in range(4):
    check(f"stream {partials}", lambda partials=partials: streamed(f"stream-{partials}", client.images.generate(model="gpt-image-1", prompt="a red circle", quality="high", stream=True, partial_images=partials), generated))
    check(f"edit stream {partials}", lambda partials=partials: streamed(f"edit-stream-{partials}", client.images.edit(model="gpt-image-1", image=image_file("in.png"), prompt="a red circle", quality="high", stream=True, partial_images=partials), edited))
check("stream n2", lambda: streamed("stream-n2", client.images.generate(model="gpt-image-1", prompt="a red circle", quality="high", n=2, stream=True, partial_images=1), generated))
check("stream strict", lambda: streamed("stream-strict", strict.images.generate(model="gpt-image-1", prompt="a red circle", quality="high", stream=True, partial_images=1), generated))
check("stream progress", lambda: streamed("stream-progress", client.images.generate(model="gpt-image-1", prompt="a red circle", quality="high", stream=True, extra_body={"stream_progress": True}), generated))
check("stream refused", lambda: client.images.generate(model="gpt-image-1", prompt="x", stream=True, size="999x999"))
check("stream failing", lambda: streamed("stream-failing", client.images.generate(model=config["damaged"], prompt="x", stream=True), generated))


# Raw responses and request ids.
def raw():
    response = client.images.with_raw_response.generate(model="dall-e-2", prompt="x", size="256x256")
    parsed = response.parse()
    return {"status": response.status_code, "request_id": response.request_id, "header": response.headers.get("x-request-id"), "parsed": type(parsed).__name__, "_request_id": parsed._request_id}


def streaming_response():
    with client.images.with_streaming_response.generate(model="dall-e-2", prompt="x", size="256x256", response_format="b64_json") as response:
        return {"status": response.status_code, "content_type": response.headers.get("content-type"), "images": len(response.json()["data"])}


check("raw", raw)
check("streaming response", streaming_response)

# Models.
check("models", lambda: [[m.id, m.object, type(m).__name__] for m in client.models.list()])
check("model", lambda: client.models.retrieve("dall-e-3").model_dump(include={"id", "object", "owned_by"}))
check("missing model", lambda: client.models.retrieve("nope"))

# Errors: the class each status is raised as.
check("bad key", lambda: OpenAI(base_url=BASE, api_key="sk-wrong-0123456789").images.generate(prompt="x"))
check("unknown model", lambda: client.images.generate(model="nope", prompt="x"))
check("bad size", lambda: client.images.generate(model="dall-e-2", prompt="x", size="1536x1024"))
check("n 11", lambda: client.images.generate(model="dall-e-2", prompt="x", n=11))
check("unknown field", lambda: client.images.generate(model="dall-e-2", prompt="x", extra_body={"colour": "red"}))
check("unknown path", lambda: client.get("/nothing", cast_to=object))
check("other method", lambda: client.get("/images/generations", cast_to=object))
check("json variation", lambda: client.post("/images/variations", body={"n": 1}, cast_to=object))
check("large upload", lambda: client.images.edit(model="dall-e-2", image=("in.png", image_bytes("in.png") + bytes(50 * 1024 * 1024), "image/png"), prompt="x"))


def sent(run, **options):
    """What `run(client)` returned or raised, and what its client sent and got."""
    log = Sent()
    try:
        outcome = {"ok": run(log.client(**options))}
    except Exception as err:
        outcome = {"error": described(err)}
    return {**outcome, "requests": log.requests, "statuses": log.statuses}


# Not retried where the server says so (x-should-retry: false), though the SDK retries 429 and 5xx.
results["over a key's images"] = sent(lambda c: c.images.generate(model="dall-e-2", prompt="x", size="256x256", n=3), api_key=config["limitedKey"], max_retries=2)
results["damaged model"] = sent(lambda c: c.images.generate(model=config["damaged"], prompt="x"), max_retries=2)


def while_busy(run):
    """`run` while a long streamed generation holds the server's only worker (QUEUE_MAX=0: nothing may wait)."""
    started, done = threading.Event(), threading.Event()

    def hold():
        for _ in OpenAI(base_url=BASE, api_key=KEY, max_retries=0).images.generate(model="demo-shapes", prompt="x", n=3, size="1024x1024", quality="hd", stream=True, partial_images=3):
            started.set()
        done.set()

    holder = threading.Thread(target=hold)
    holder.start()
    started.wait(60)
    try:
        return run()
    finally:
        holder.join()


# A full queue's 429: retried after its Retry-After, the form sent again whole. Retries enough for the
# holder to end on a slow machine: each Retry-After is the server's estimate of the work left, which errs
# short while the holder is within a (guessed) estimate that the machine's load makes it outlast.
results["edit retried"] = while_busy(lambda: sent(lambda c: saved("edit-retried", c.images.edit(model="dall-e-2", image=image_file("in.png"), prompt="a red circle", size="256x256", response_format="b64_json")), max_retries=30))
results["refused without retries"] = while_busy(lambda: sent(lambda c: c.images.generate(model="dall-e-2", prompt="x", size="256x256"), max_retries=0))


async def concurrent():
    """AsyncOpenAI: requests at once (those the busy worker refuses are retried), an edit, a stream, models, an error."""
    async with AsyncOpenAI(base_url=BASE, api_key=KEY, max_retries=5) as a:
        answers = await asyncio.gather(*[a.images.generate(model="dall-e-2", prompt="a red circle", size="256x256", n=2, response_format="b64_json") for _ in range(3)])
        edit = await a.images.edit(model="dall-e-2", image=image_file("in.png"), prompt="x", size="256x256", response_format="b64_json")
        stream = await a.images.generate(model="gpt-image-1", prompt="x", quality="high", stream=True, partial_images=1)
        events = [type(event).__name__ async for event in stream]
        models = [m.id async for m in a.models.list()]
        try:
            await a.images.generate(model="nope", prompt="x")
            error = None
        except openai.APIStatusError as err:
            error = type(err).__name__
        return {
            "files": [file for i, answer in enumerate(answers) for file in saved(f"async-{i}", answer)] + saved("async-edit", edit),
            "events": events,
            "models": len(models),
            "error": error,
        }


check("async", lambda: asyncio.run(concurrent()))


# docs/api.md's examples, run as written (in the work folder, where their files are) but for the address.
def examples():
    os.chdir(WORK)
    names = {"key": KEY}
    results = []
    for code in config["docs"]:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(code, names)
        result = names.pop("result", None)
        results.append({"images": len(result.data) if result is not None else None, "printed": printed.getvalue(), "files": sorted(os.listdir(WORK))})
    return results


check("docs", examples)

# Last: the worker goes on with the abandoned generation until its next step.
check("timeout", lambda: OpenAI(base_url=BASE, api_key=KEY, timeout=0.05, max_retries=0).images.generate(model="dall-e-2", prompt="x", n=6, size="1024x1024", quality="hd"))

print(json.dumps({"version": openai.__version__, "results": results}, default=repr))
