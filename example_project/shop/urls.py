from rest_framework.routers import DefaultRouter

from .views import OrderViewSet, ProductViewSet

router = DefaultRouter()
router.register("products", ProductViewSet, basename="product")
router.register("orders", OrderViewSet, basename="order")
urlpatterns = router.urls
