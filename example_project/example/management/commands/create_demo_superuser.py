import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = (
        "Create (or reset) a superuser for trying the admin locally, with a random "
        "password printed once. No password is shipped with the project."
    )

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")
        parser.add_argument("--password", help="Use this password instead of a random one.")

    def handle(self, *args, **options):
        username = options["username"].strip()
        if not username:
            raise CommandError("--username must not be empty")
        password = options["password"] or secrets.token_urlsafe(12)
        user_model = get_user_model()
        user, created = user_model._default_manager.get_or_create(
            **{user_model.USERNAME_FIELD: username}
        )
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        verb = "created" if created else "reset"
        self.stdout.write(f"superuser {username!r} {verb}; password: {password}")
