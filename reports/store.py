"""Reading an MLflow store at any size: every run a filter matches, page by page (one `search_runs`
call returns at most 50,000 runs, and silently no more)."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

PAGE = 10_000


def search_all(client: MlflowClient, experiment_ids: list[str], filter_string: str = "",
               order_by: list[str] | None = None) -> list:
    runs, token = [], None
    while True:
        page = client.search_runs(experiment_ids, filter_string=filter_string, max_results=PAGE,
                                  order_by=order_by, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs
