import bucketstore as bs

B = 'todos["u1"]'
with bs.open("quickstart.bsdb") as db:  # run it again: it opens the same file and stream
    with db.storage(db.create_stream("rules-v1", exist_ok=True)) as st:
        with st.writer(snapshot=True) as w:  # the initial snapshot: rows it has are skipped
            w.save("todos", "insert", "t1", [(B, "todos", "t1", '{"id":"t1","done":false}')],
                   lookups=[(["u1"], ['{"list":"u1"}'])])
            w.snapshot_done("00000010")
            cp = w.commit("00000010").checkpoint
        for chunk in st.bucket_data(cp, {B: 0}):  # as many library calls as it takes
            for op in chunk.ops:
                print(op.op_id, op.op.name, op.object_id, op.data, op.checksum)
        print(st.checksums(cp, [B])[B])  # Checksum(checksum=-1690362916, count=1)
        print(st.parameter_sets(cp, [["u1"]]))  # [{'list': 'u1'}]
