"""What a study is and holds, without Ray: its file (`config`), its plan (`plan`), its data and inputs,
its folder (`folder`, `handle`), its journal and the state that decides what runs next (`state`)."""
