def merchant_of(request):
    """The tenant of an authenticated request: the user's merchant."""
    membership = getattr(request.user, "membership", None)
    return membership.merchant_id if membership is not None else None
