import factory

from tests.testapp.models import QueueJob, Repository


class RepositoryFactory(factory.django.DjangoModelFactory[Repository]):
    class Meta:
        model = Repository

    name = factory.Sequence(lambda n: f"repo-{n}")


class JobFactory(factory.django.DjangoModelFactory[QueueJob]):
    class Meta:
        model = QueueJob

    behavior = "ok"
    payload = factory.LazyFunction(dict)
