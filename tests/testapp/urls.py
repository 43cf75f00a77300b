from django.contrib import admin
from django.contrib.staticfiles.views import serve
from django.urls import path, re_path

from django_idempotency_outbox.metrics import metrics_view
from outbox import health_view
from tests.testapp import views

create = {"post": "create"}
collection = {"get": "list", "post": "create"}
item = {"get": "retrieve"}

urlpatterns = [
    path("admin/", admin.site.urls),
    # The admin's CSS and JS, served by Django itself for the browser tests (tests/browser).
    re_path(r"^static/(?P<path>.*)$", serve, {"insecure": True}),
    path("orders/", views.OrderViewSet.as_view(create)),
    path("v2/orders/", views.OrderViewSet.as_view(create)),
    path("orders-waiting/", views.OrderWaitingViewSet.as_view(create)),
    path("orders-optional/", views.OrderOptionalKeyViewSet.as_view(create)),
    path("orders-short/", views.OrderShortTTLViewSet.as_view(create)),
    path("orders-hooked/", views.OrderHookedViewSet.as_view(create)),
    path("orders-write/", views.OrderWriteView.as_view()),
    path("uploads/", views.UploadView.as_view()),
    path("plain-orders/", views.PlainOrderViewSet.as_view(create)),
    path("tenant-orders/", views.TenantOrderViewSet.as_view(create)),
    path("django-orders/", views.plain_django_create),
    path("payments/<str:order>/capture/", views.CaptureView.as_view()),
    path("orders/<str:pk>/capture/", views.CaptureOrderView.as_view()),
    path("scoped-orders/", views.ScopedOrderViewSet.as_view(collection)),
    path("scoped-orders/<int:pk>/", views.ScopedOrderViewSet.as_view(item)),
    path("order-book/", views.IdempotentOrderBookViewSet.as_view(collection)),
    path("order-book/<int:pk>/", views.IdempotentOrderBookViewSet.as_view(item)),
    path("lazy-skus/", views.LazySkusView.as_view()),
    path("unscoped-status/", views.UnscopedStatusView.as_view()),
    path("django-scoped-orders/", views.plain_scoped_orders),
    path("header-tenant-orders/", views.TenantFromHeaderViewSet.as_view(collection)),
    path("opted-out-order-book/", views.OptedOutOrderBookViewSet.as_view(collection)),
    path("streamed-skus/", views.StreamedSkusView.as_view()),
    path("fuzz-orders/", views.FuzzOrderViewSet.as_view(create)),
    path("fuzz-django-orders/", views.fuzz_django_create),
    path("published-orders/", views.PublishingOrderViewSet.as_view(create)),
    path("answering/", views.AnsweringView.as_view()),
    path("orders-holding/", views.HoldingOrderViewSet.as_view(create)),
    path("orders-refused/", views.PermissionRefusedOrderViewSet.as_view(create)),
    path("orders-throttled/", views.ThrottledOrderViewSet.as_view(create)),
    path("orders-default-scope/", views.DefaultScopeOrderViewSet.as_view(create)),
    path("orders-hooked-identity/", views.OrderScopeAndPrincipalHooksViewSet.as_view(create)),
    path("orders-hooked-fingerprint/", views.OrderFingerprintHookViewSet.as_view(create)),
    path("metrics", metrics_view),
    path("healthz/outbox", health_view),
]
