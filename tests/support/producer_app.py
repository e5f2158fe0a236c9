"""An App the loading tests import by name (``support.producer_app:app``), and objects that are not one."""

from __future__ import annotations

from skiplock import App

app = App()
empty = App(name="empty")
not_an_app = {"tasks": []}


@app.task(name="producer.send", queue="mail")
def send(job):
    return None
