"""active version of each model (one truth for every serving process and replica)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "active_versions",
        sa.Column("model", sa.String(128), primary_key=True),
        sa.Column("version", sa.String(128), nullable=False),
        sa.Column("explicit", sa.Boolean(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("active_versions")
