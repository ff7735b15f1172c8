from distrl.cli import main

raise SystemExit(main())
