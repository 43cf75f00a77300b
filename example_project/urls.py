from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema")),
    path("", include("example_project.shop.urls")),
]

# Django's own errors (no view matches, a request refused before any view) are
# problems too, like the library's and DRF's (REST_FRAMEWORK["EXCEPTION_HANDLER"]).
handler400 = "django_idempotency_outbox.problems.bad_request"
handler403 = "django_idempotency_outbox.problems.permission_denied"
handler404 = "django_idempotency_outbox.problems.page_not_found"
handler500 = "django_idempotency_outbox.problems.server_error"
