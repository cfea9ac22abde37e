"""The FastAPI side of the REST API: health, metadata, labels, test predictions, metrics, docs."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from pipeserve.errors import PipeserveError
from pipeserve.observability.context import request_id_var
from pipeserve.observability.metrics import CONTENT_TYPE_LATEST, Metrics
from pipeserve.pipeline.codec import dump_json
from pipeserve.server.rest.errors import error_body, map_exception
from pipeserve.server.rest.schemas import (
    ErrorResponse,
    HealthResponse,
    LabelResponse,
    LiveResponse,
    PredictRequest,
    PredictResponse,
    ReadyResponse,
)
from pipeserve.service import InferenceService

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dump_json(content)


def build_api(service: InferenceService, metrics: Metrics, lifespan: Lifespan, *, root_path: str = "") -> FastAPI:
    """The FastAPI app for everything but the prediction hot path (which ``RestApp`` serves directly)."""
    spec = service.spec
    app = FastAPI(
        title=f"pipeserve: {spec.name}",
        version=spec.version,
        description=spec.description or f"Pipeline {spec.name!r} served by pipeserve.",
        lifespan=lifespan,
        default_response_class=JSONResponse,
        root_path=root_path,
    )

    @app.get("/health", response_model=HealthResponse, tags=["health"])
    async def health() -> Any:
        """The seed's health check: ``{"health": "ok"}`` while the process serves."""
        return {"health": "ok"}

    @app.get("/health/live", response_model=LiveResponse, tags=["health"])
    async def live() -> Any:
        """Liveness: 200 while the process can answer at all."""
        return {"live": True}

    @app.get("/health/ready", response_model=ReadyResponse, tags=["health"], responses={503: {"model": ReadyResponse}})
    async def ready() -> Any:
        """Readiness: 200 only after the models loaded, warmed up and passed the golden check."""
        body = {
            "ready": service.is_ready,
            "state": service.state.value,
            "reason": service.reason,
            "fingerprint": service.fingerprint,
        }
        return JSONResponse(
            body,
            status_code=200 if service.is_ready else 503,
            headers=None if service.is_ready else {"Retry-After": "5"},
        )

    @app.get("/metadata", tags=["model"])
    async def metadata() -> Any:
        """Input and output types, structures and samples, the nodes and the release fingerprint."""
        return JSONResponse(service.metadata())

    @app.get("/label", tags=["model"])
    async def label() -> Any:
        """Class id -> class name."""
        return service.labels()

    @app.get("/predict/test", response_model=PredictResponse, tags=["predict"])
    async def predict_test() -> Any:
        """Predict on the pipeline's sample input."""
        return JSONResponse({"prediction": await service.predict(service.sample)})

    @app.get("/predict/test/label", response_model=LabelResponse, tags=["predict"])
    async def predict_test_label() -> Any:
        """The label of the pipeline's sample input."""
        return JSONResponse({"prediction": await service.predict_label(service.sample)})

    @app.get("/tags", tags=["model"])
    async def tags() -> Any:
        """The class names, in class-id order (the tags ``/predict/tag`` chooses from)."""
        return JSONResponse(list(service.labels().values()))

    @app.get("/metrics", tags=["health"], response_class=Response)
    async def prometheus_metrics() -> Response:
        """Prometheus metrics in text format."""
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    _install_error_handlers(app)
    extra = [name for name in service.endpoints if name != "predict"]
    _document_fast_routes(app, extra, uploads=service.spec.input.kind == "image")
    return app


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(PipeserveError)
    async def domain_error(request: Request, exc: PipeserveError) -> Response:
        status, body, headers = map_exception(exc, request_id_var.get() or "")
        return Response(
            body,
            status_code=status,
            media_type="application/json",
            headers={k.decode(): v.decode() for k, v in headers},
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        rid = request_id_var.get() or ""
        if exc.status_code == 404:
            body = error_body(
                f"no route {request.method} {request.url.path}",
                request_id=rid,
                expected="a path listed in the OpenAPI document at /docs",
            )
        elif exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "")
            body = error_body(
                f"method {request.method} is not allowed on {request.url.path}",
                request_id=rid,
                expected=allowed or None,
            )
        else:
            body = error_body(str(exc.detail), request_id=rid)
        return Response(body, status_code=exc.status_code, media_type="application/json", headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {"msg": "invalid request", "loc": ()}
        where = ".".join(str(p) for p in first.get("loc", ()))
        body = error_body(f"{where}: {first['msg']}", request_id=request_id_var.get() or "")
        return Response(body, status_code=400, media_type="application/json")


def _document_fast_routes(app: FastAPI, endpoints: list[str], *, uploads: bool) -> None:
    """Add the prediction routes, which ``RestApp`` serves without FastAPI, to the OpenAPI document."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in (PredictRequest, PredictResponse, LabelResponse, ErrorResponse):
            components[model.__name__] = model.model_json_schema(ref_template="#/components/schemas/{model}")

        def ref(model: type[Any]) -> dict[str, Any]:
            return {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}

        errors = {
            "400": {
                "description": "The input is malformed; the body says what was wrong and what is expected.",
                **ref(ErrorResponse),
            },
            "413": {"description": "The body is over the size limit.", **ref(ErrorResponse)},
            "503": {"description": "Not ready, or overloaded (see Retry-After).", **ref(ErrorResponse)},
        }
        body: dict[str, Any] = {"required": True, **ref(PredictRequest)}
        if uploads:
            body["content"]["multipart/form-data"] = {
                "schema": {
                    "type": "object",
                    "properties": {"image": {"type": "string", "format": "binary"}},
                    "required": ["image"],
                }
            }
        parameters = [
            {
                "name": "X-Request-Timeout-Ms",
                "in": "header",
                "required": False,
                "schema": {"type": "number"},
                "description": "The request's deadline; queued work past it never runs (504).",
            },
            {
                "name": "X-Request-ID",
                "in": "header",
                "required": False,
                "schema": {"type": "string"},
                "description": "Your id for this request, returned and logged; one is made when absent.",
            },
        ]
        top_k = {
            "name": "k",
            "in": "query",
            "required": False,
            "schema": {"type": "integer", "minimum": 1},
            "description": "How many classes a top_k step returns.",
        }
        routes = [
            ("/predict", "Predict: the pipeline's output for `data`", PredictResponse),
            ("/predict/label", "Predict the class name for `data`", LabelResponse),
            *(
                (f"/predict/{name}", f"The `{name}` endpoint's output for `data`", PredictResponse)
                for name in endpoints
            ),
        ]
        for path, summary, response in routes:
            schema["paths"][path] = {
                "post": {
                    "tags": ["predict"],
                    "summary": summary,
                    "operationId": path.strip("/").replace("/", "_"),
                    "parameters": [*parameters, *([top_k] if path != "/predict/label" else [])],
                    "requestBody": body,
                    "responses": {
                        "200": {"description": "Prediction", **ref(response)},
                        "504": {"description": "The request's deadline passed.", **ref(ErrorResponse)},
                        **errors,
                    },
                }
            }
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
