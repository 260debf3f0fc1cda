"""The project's Prefect events, and what the deployments in prefect.yaml trigger on.

- `jf.prompts.added` (resource `jf.prompts.<collection>`, payload `uri`, `rows`, `sha256`): a prompt file was
  added (`jf prompts add`, or any producer that emits the same event). `jf-round/retrain-on-new-prompts` starts a
  round from the champion with that file merged into the profile's prompts.
- `jf.model.champion-changed` (resource `mlflow.model.<name>`, payload `model`, `version`, `uri`): the gate moved
  the `champion` alias. `jf-benchmark/champion` benchmarks the new champion. Emitted by the registering task; the
  MLflow OSS server's webhooks cannot reach a Prefect server without Prefect Cloud's webhook endpoint, so the
  producer that moves the alias is the one that says so.

Producers outside a flow use `emit_now`, which fails loudly when the server cannot take the event (Prefect's
`emit_event` only logs); inside a flow, `emit_event` is enough: the flow's events worker drains before it ends."""

from __future__ import annotations

import asyncio

PROMPTS_ADDED = "jf.prompts.added"
CHAMPION_CHANGED = "jf.model.champion-changed"


def prompts_resource(collection: str) -> dict[str, str]:
    return {"prefect.resource.id": f"jf.prompts.{collection}", "prefect.resource.name": f"{collection} prompts"}


def model_resource(name: str) -> dict[str, str]:
    return {"prefect.resource.id": f"mlflow.model.{name}", "prefect.resource.name": name}


def emit_now(event: str, resource: dict[str, str], payload: dict) -> str:
    """Send one event to the Prefect server at PREFECT_API_URL and wait until it is taken; returns its id."""
    from prefect.events.clients import PrefectEventsClient
    from prefect.events.schemas.events import Event
    from prefect.settings import PREFECT_API_URL

    api = PREFECT_API_URL.value()
    if not api:
        raise RuntimeError(
            "PREFECT_API_URL is not set: no Prefect server would see the event (start `jf stack up` and source "
            "its stack.env, or point PREFECT_API_URL at your server)"
        )
    evt = Event(event=event, resource=resource, payload=payload)

    async def send() -> None:
        async with PrefectEventsClient(api_url=api, checkpoint_every=1) as client:
            await client.emit(evt)

    try:
        asyncio.run(send())
    except Exception as err:
        raise RuntimeError(f"could not send {event} to the Prefect server at {api}: {err}") from err
    return str(evt.id)


def champion_changed(name: str, version: str) -> None:
    """From the registering task, once the gate has moved the alias."""
    from prefect.events import emit_event

    emit_event(
        CHAMPION_CHANGED,
        resource=model_resource(name),
        payload={"model": name, "version": str(version), "uri": f"models:/{name}/{version}"},
    )
