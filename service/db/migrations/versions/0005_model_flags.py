"""model_flags: which model is the default and which are deactivated; datasets.deleted_at: a dataset
deleted while ended jobs name it keeps its record (its file goes)

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-09
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_flags",
        sa.Column("model", sa.String(128), primary_key=True),
        sa.Column("deactivated", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("is_default", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )
    op.add_column("datasets", sa.Column("deleted_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("deleted_at")
    op.drop_table("model_flags")
