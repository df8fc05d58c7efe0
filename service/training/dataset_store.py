"""All reads and writes of dataset records, as short transactions.

A dataset's record is listed only once its file is stored (`service.training.datasets.ingest`); deleting
it is refused while a queued or running job names it, and only marks it deleted while ended jobs do, so
their history still says what they trained on.
"""

from __future__ import annotations

import time

from sqlalchemy import or_, select

from service.db.locks import lock_writes
from service.db.records import Records
from service.db.tables import ACTIVE_STATES, DatasetRow, JobRow
from service.errors import Conflict, NotFound


class DatasetStore(Records):
    """The dataset records of the job database; safe to share between threads (one session per call)."""

    def add_dataset(self, row: DatasetRow) -> DatasetRow:
        with self.session() as s:
            s.add(row)
        return row

    def get_dataset(self, dataset_id: str) -> DatasetRow | None:
        with self.session() as s:
            return s.get(DatasetRow, dataset_id)

    def dataset_by_checksum(self, checksum: str) -> DatasetRow | None:
        with self.session() as s:
            return s.scalars(select(DatasetRow).where(DatasetRow.checksum == checksum)).first()

    def list_datasets(self, *, limit: int, cursor: str | None = None) -> tuple[list[DatasetRow], str | None]:
        """Newest first, one page; the second value is the cursor of the next page (None: the last).
        Datasets deleted while ended jobs named them are not listed."""
        listed = select(DatasetRow).where(DatasetRow.deleted_at.is_(None))
        return self._page(listed, DatasetRow, limit, cursor)

    def deleted_among(self, ids: list[str]) -> set[str]:
        """Which of these dataset ids were deleted (their records kept for the jobs that name them)."""
        with self.session() as s:
            q = select(DatasetRow.id).where(DatasetRow.id.in_(ids), DatasetRow.deleted_at.is_not(None))
            return set(s.scalars(q))

    def revive_dataset(self, dataset_id: str, name: str, filename: str) -> DatasetRow:
        """The same bytes uploaded again after their dataset was deleted: listed again, under the new name
        (the caller has stored the file again)."""
        with self.session() as s:
            row = s.get(DatasetRow, dataset_id, with_for_update=True)
            if row is None:
                raise NotFound(f"dataset {dataset_id!r} not found")
            row.deleted_at, row.name, row.filename, row.created_at = None, name, filename, time.time()
            return row

    def delete_dataset(self, dataset_id: str) -> DatasetRow:
        """Remove the record; refused while a queued or running job names the dataset (as its training,
        test, label-texts or replay set). Named only by ended jobs, the record stays, marked deleted, so
        their history still says what they trained on (the caller removes the file either way)."""
        with self.session() as s:
            lock_writes(s)  # on PostgreSQL the row's lock waits instead, for a job being recorded on it
            row = s.get(DatasetRow, dataset_id, with_for_update=True)
            if row is None or row.deleted_at is not None:
                raise NotFound(f"dataset {dataset_id!r} not found", field=("dataset_id",))
            users = list(
                s.scalars(
                    select(JobRow)
                    .where(or_(JobRow.train_dataset == dataset_id, JobRow.test_dataset == dataset_id,
                               JobRow.label_texts == dataset_id,
                               JobRow.base["replay_dataset"].as_string() == dataset_id))
                    .order_by(JobRow.created_at)
                    .limit(20)
                )
            )
            active = [j.id for j in users if j.state in ACTIVE_STATES]
            if active:
                raise Conflict(
                    f"dataset {dataset_id!r} is used by {len(active)} queued or running job(s) "
                    f"({', '.join(active)}); cancel them or wait until they end",
                    field=("dataset_id",),
                )
            if users:
                row.deleted_at = time.time()
                return row
            s.delete(row)
            return row
