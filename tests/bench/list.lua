-- wrk script: the first page of the job list (50 newest jobs).
wrk.method = "GET"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("TRAINYARD_TOKEN")
