import threading

from django.contrib import admin
from django.contrib.staticfiles.views import serve
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from django_idempotency_outbox.metrics import metrics_view
from example_project.traces import traces
from outbox import health_view


class SchemaView(SpectacularAPIView):
    """drf-spectacular's schema view, generating one schema at a time in a process.

    drf-spectacular imports some of its extensions, and loads their classes,
    during the first schema generation, and keeps generation statistics in a
    module-level object: two threads generating at once (the first concurrent
    ``/schema/`` requests of a threaded gunicorn worker) trip over each
    other's half-loaded state and answer 500. Generating is rare and quick;
    one at a time costs nothing that matters (docs/operations.md).
    """

    _generating = threading.Lock()

    def get(self, request, *args, **kwargs):
        with self._generating:
            return super().get(request, *args, **kwargs)


# The admin's "View site": the API's own pages (its root answers 401 to a browser).
admin.site.site_url = "/docs/"

urlpatterns = [
    path("admin/", admin.site.urls),
    # Operators' endpoints; in production, route them where only Prometheus and
    # the orchestrator reach them.
    path("metrics", metrics_view),
    path("healthz/outbox", health_view),
    path("traces/", traces),
    # The admin's CSS, served by Django (the demo's proxy only checks and buffers requests).
    re_path(r"^static/(?P<path>.*)$", serve, {"insecure": True}),
    path("schema/", SchemaView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema")),
    path("", include("example_project.shop.urls")),
]

# Django's own errors (no view matches, a request refused before any view) are
# problems too, like the library's and DRF's (REST_FRAMEWORK["EXCEPTION_HANDLER"]).
handler400 = "django_idempotency_outbox.problems.bad_request"
handler403 = "django_idempotency_outbox.problems.permission_denied"
handler404 = "django_idempotency_outbox.problems.page_not_found"
handler500 = "django_idempotency_outbox.problems.server_error"
