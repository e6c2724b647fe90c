import bucketstore as bs

B = 'todos["u1"]'
with bs.open("quickstart.bsdb") as db, db.storage(db.create_stream("rules-v1")) as st:
    with st.writer() as w:  # one writer per stream; a commit makes everything visible at once
        w.save("todos", "insert", "t1", rows=[(B, "todos", "t1", '{"id":"t1","done":false}')],
               lookups=[(["u1"], ['{"list":"u1"}'])])
        w.snapshot_done("00000010")
        cp = w.commit("00000010").checkpoint
    for chunk in st.bucket_data(cp, {B: 0}):  # iterates over as many library calls as needed
        for op in chunk.ops:
            print(op.op_id, op.op.name, op.object_id, op.data, op.checksum)
    print(st.checksums(cp, [B])[B])  # Checksum(checksum=..., count=1)
    print(st.parameter_sets(cp, [["u1"]]))  # ['{"list":"u1"}']
