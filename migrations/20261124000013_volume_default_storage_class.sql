-- A volume without a storage class uses the cluster's default class (the PersistentVolumeClaim
-- names none), rather than a class called `standard` that many clusters do not have.
ALTER TABLE volumes ALTER COLUMN storage_class DROP NOT NULL;
