from django.db import models


class Order(models.Model):
    email = models.EmailField()
    confirmed = models.BooleanField(default=False)
